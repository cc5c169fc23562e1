//! The documentation's examples run, so the docs cannot drift from the code (issue 37, "What
//! to build": "a user guide in `docs/` ... with its shell examples run by the test suite").
//!
//! - Every block fenced as ```` ```sh tested ```` in `README.md` and `docs/*.md` is run with
//!   bash against the real binary (`postbox` on `PATH` is `target/debug/postbox`), the real
//!   Mosquitto clients, `curl` and `jq`, bounded in time; a `text` block right under it (only
//!   blank lines between) is its expected output, stdout and stderr together, line for line
//!   (`…` stands for any text within a line; a line of `…` alone for any lines; its ports
//!   are moved as the block's are).
//! - The examples read as a user types them: the test moves their well-known ports (1883,
//!   9883, 8883, ...) to free ones, in the block and in a copy of `config/` the block runs
//!   beside, and gives the Mosquitto clients `-h 127.0.0.1 -p <the 1883 port>` as defaults
//!   (their options file). A line that starts a server in the background (`postbox ... &`,
//!   `mosquitto ... &`) is started by the test, which waits for it to say it runs; the servers
//!   of a block serve the page's later blocks until another block starts its own.
//! - Every ```` ```toml ```` block parses and validates with the real config loader.
//! - `docs/configuration.md`'s index of keys is checked against `config/postbox.toml` both
//!   ways, with the config loader as the judge of which keys exist.
//! - Relative links of the pages name files that exist, and their `#anchors` headings there.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use postbox::config::Config;

use crate::common::process::{free_port, Output, BIN};
use crate::common::WAIT;

/// The ports the examples use as a user would; each gets a free one per scene.
const WELL_KNOWN_PORTS: [u16; 13] = [
    1883, 1884, 1891, 1892, 4222, 8883, 8884, 9001, 9002, 9883, 9884, 9891, 9892,
];

/// How long one block's commands may take (a subscriber waiting for a message that never
/// comes is cut off here, and the block fails).
const BLOCK_LIMIT: Duration = Duration::from_secs(60);

/// The repository root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `README.md` and every page of `docs/`, as (path relative to the root, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).expect("page");
            (n, text)
        })
        .collect()
}

/// One fenced block of a page.
#[derive(Debug)]
struct Block {
    /// What follows the opening fence (`sh tested`, `toml`, `text`, ...).
    info: String,
    /// Its lines, without the fence's indentation.
    text: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// Only blank lines between the previous block's closing fence and this one.
    right_after_previous: bool,
}

/// The fenced blocks of `page`, in order (fences may be indented, as in a list item).
fn blocks(page: &str) -> Vec<Block> {
    let mut found = Vec::new();
    let mut open: Option<(usize, String, usize, Vec<String>, bool)> = None;
    let mut prose_since_block = true;
    for (i, line) in page.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None if trimmed.starts_with("```") => {
                let indent = line.len() - trimmed.len();
                let info = trimmed.trim_start_matches('`').trim().to_owned();
                open = Some((i + 1, info, indent, Vec::new(), !prose_since_block));
            }
            None => {
                if !trimmed.is_empty() {
                    prose_since_block = true;
                }
            }
            Some((start, info, _, lines, after)) if trimmed == "```" => {
                found.push(Block {
                    info,
                    text: lines.join("\n"),
                    line: start,
                    right_after_previous: after,
                });
                prose_since_block = false;
            }
            Some((start, info, indent, mut lines, after)) => {
                let cut = line.len() - line.trim_start().len();
                lines.push(line[cut.min(indent)..].to_owned());
                open = Some((start, info, indent, lines, after));
            }
        }
    }
    assert!(open.is_none(), "a fence is not closed");
    found
}

/// A runnable example: a `sh tested` block and the output the page shows under it.
#[derive(Debug)]
struct Example {
    page: String,
    line: usize,
    script: String,
    expected: Option<String>,
}

/// The examples of one page.
fn examples(page: &str, text: &str) -> Vec<Example> {
    let blocks = blocks(text);
    let mut found = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        if block.info != "sh tested" {
            continue;
        }
        let expected = blocks
            .get(i + 1)
            .filter(|next| next.info == "text" && next.right_after_previous)
            .map(|next| next.text.clone());
        found.push(Example {
            page: page.to_owned(),
            line: block.line,
            script: block.text.clone(),
            expected,
        });
    }
    found
}

/// A server an example starts in the background: the command to run (without `&`) and the
/// line it writes once it serves.
fn server_line(line: &str) -> Option<(String, &'static str)> {
    let code = line.split(" #").next().unwrap_or(line).trim();
    let command = code.strip_suffix('&')?.trim();
    let mut words = command.split_whitespace();
    let ready = match (words.next(), words.next()) {
        (Some("postbox"), Some("passwd" | "bridge")) => return None,
        (Some("postbox"), _) => "postbox running",
        (Some("mosquitto"), _) => " running",
        (Some("nats-server"), _) => "Server is ready",
        _ => return None,
    };
    Some((command.to_owned(), ready))
}

/// A server started for the examples, killed with its scene.
struct Server {
    /// The server process (the binary itself: the wrapper and bash `exec` it).
    child: Child,
    /// The line that started it, for a failure report.
    command: String,
    /// What it logged.
    output: Output,
}

/// Where a page's examples run: a working directory with a copy of `config/` (ports moved)
/// and `certs/`, a `bin/` whose `postbox` is the binary under test on this scene's ports,
/// the Mosquitto clients' defaults, and the servers started so far.
struct Scene {
    /// The working directory, removed with the scene.
    dir: tempfile::TempDir,
    /// Well-known port -> this scene's free port.
    ports: BTreeMap<u16, u16>,
    /// Started by this scene's examples, killed with it.
    servers: Vec<Server>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
    }
}

impl Scene {
    /// A fresh directory, ports, `bin/postbox` and client defaults.
    fn new() -> Scene {
        let dir = tempfile::tempdir().expect("scene dir");
        let ports: BTreeMap<u16, u16> = WELL_KNOWN_PORTS
            .iter()
            .map(|&port| (port, free_port()))
            .collect();
        let scene = Scene {
            dir,
            ports,
            servers: Vec::new(),
        };
        scene.copy_config(&root().join("config"), &scene.path().join("config"));
        std::os::unix::fs::symlink(root().join("certs"), scene.path().join("certs"))
            .expect("certs link");
        let bin = scene.path().join("bin");
        std::fs::create_dir(&bin).expect("bin");
        let wrapper = bin.join("postbox");
        std::fs::write(&wrapper, scene.wrapper()).expect("wrapper");
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let xdg = scene.path().join("xdg");
        std::fs::create_dir(&xdg).expect("xdg");
        let defaults = format!("-h 127.0.0.1\n-p {}\n", scene.ports[&1883]);
        for client in ["mosquitto_pub", "mosquitto_sub"] {
            std::fs::write(xdg.join(client), &defaults).expect("client defaults");
        }
        scene
    }

    /// The scene's working directory.
    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `postbox` as the reader runs it: the binary under test, given this scene's MQTT and
    /// metrics ports where the reader's would be the defaults (1883, 9883): the embedded
    /// default, or a file without a listener or `[metrics]` table, unless a flag names them.
    fn wrapper(&self) -> String {
        format!(
            r#"#!/bin/sh
case "$1" in passwd|bridge|help|--help|-h|--version|-V) exec "{BIN}" "$@";; esac
mqtt=yes; metrics=yes; previous=
for a in "$@"; do
  case "$previous" in
    -c|--config)
      if grep -q '^\[\[*listener\]' "$a"; then mqtt=no; fi
      if grep -q '^\[metrics\]' "$a"; then metrics=no; fi;;
  esac
  case "$a" in
    -p|--port|--port=*) mqtt=no;;
    --metrics-port|--metrics-port=*) metrics=no;;
  esac
  previous=$a
done
if [ $mqtt = yes ]; then set -- "$@" --port {}; fi
if [ $metrics = yes ]; then set -- "$@" --metrics-port {}; fi
exec "{BIN}" "$@"
"#,
            self.ports[&1883], self.ports[&9883]
        )
    }

    /// Copies `from` to `to`, TOML files with their ports moved and on loopback only.
    fn copy_config(&self, from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("config copy");
        for entry in std::fs::read_dir(from).expect("config/").flatten() {
            let target = to.join(entry.file_name());
            if entry.path().is_dir() {
                self.copy_config(&entry.path(), &target);
            } else if entry.path().extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(entry.path()).expect("toml");
                let text = self.rewrite(&text).replace("0.0.0.0:", "127.0.0.1:");
                std::fs::write(target, text).expect("toml copy");
            } else {
                std::fs::copy(entry.path(), target).expect("copy");
            }
        }
    }

    /// `text` with every well-known port (a whole number) moved to this scene's, and
    /// `localhost:` spelled `127.0.0.1:` (the tests talk to IPv4 loopback only).
    fn rewrite(&self, text: &str) -> String {
        let text = text.replace("localhost:", "127.0.0.1:");
        let mut out = String::with_capacity(text.len());
        let mut digits = String::new();
        for c in text.chars().chain(std::iter::once('\n')) {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            match digits.parse::<u16>().ok().and_then(|n| self.ports.get(&n)) {
                Some(port) if digits.len() == 4 => out.push_str(&port.to_string()),
                _ => out.push_str(&digits),
            }
            digits.clear();
            out.push(c);
        }
        out.pop();
        out
    }

    /// A command with this scene's `bin/` first on `PATH`, its client defaults, in its
    /// directory.
    fn command(&self, script: &str) -> Command {
        let path = std::env::var("PATH").unwrap_or_default();
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .current_dir(self.path())
            .env(
                "PATH",
                format!("{}:{path}", self.path().join("bin").display()),
            )
            .env("XDG_CONFIG_HOME", self.path().join("xdg"))
            .env("HOME", self.path())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// Starts a server line and waits (bounded) until it says it serves.
    fn start_server(&mut self, command: &str, ready: &'static str) -> Result<(), String> {
        let mut child = self
            .command(&format!("exec {command}"))
            .spawn()
            .map_err(|e| format!("`{command}`: {e}"))?;
        let output = Output::read(&mut child);
        let started = output.wait(0, WAIT, |line| line.contains(ready)).is_some();
        self.servers.push(Server {
            child,
            command: command.to_owned(),
            output: output.clone(),
        });
        if started {
            Ok(())
        } else {
            Err(format!(
                "`{command}` did not say {ready:?} within {WAIT:?}:\n{}",
                output.lines().join("\n")
            ))
        }
    }

    /// Runs client lines as one bash script (stderr into stdout, `set -e`), bounded by
    /// [`BLOCK_LIMIT`]; whatever it left in the background is killed with it. Its output, or
    /// why it failed.
    fn run_script(&self, script: &str) -> Result<Vec<String>, String> {
        let mut child = self
            .command(&format!("exec 2>&1\nset -e\n{script}"))
            .process_group(0)
            .spawn()
            .map_err(|e| format!("bash: {e}"))?;
        let output = Output::read(&mut child);
        let group = i32::try_from(child.id()).expect("pid");
        let (done, exit) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = done.send(child.wait());
            child
        });
        let status = exit.recv_timeout(BLOCK_LIMIT);
        // SAFETY: kill(2) of the process group this script leads (created by `process_group(0)`
        // above): the script and anything it started in the background, nothing else.
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = waiter.join();
        output.wait_closed(WAIT);
        let lines = output.lines();
        match status {
            Ok(Ok(status)) if status.success() => Ok(lines),
            Ok(Ok(status)) => Err(format!("exited with {status}:\n{}", lines.join("\n"))),
            Ok(Err(e)) => Err(format!("wait: {e}")),
            Err(_) => Err(format!(
                "did not finish within {BLOCK_LIMIT:?}:\n{}",
                lines.join("\n")
            )),
        }
    }

    /// Runs an example's lines in order: servers started and awaited, the lines between them
    /// as scripts. Everything the scripts printed.
    fn run(&mut self, script: &str) -> Result<Vec<String>, String> {
        let script = self.rewrite(script);
        let mut printed = Vec::new();
        let mut pending = String::new();
        for line in script.lines() {
            match server_line(line) {
                Some((command, ready)) => {
                    if !pending.trim().is_empty() {
                        printed.extend(self.run_script(&pending)?);
                    }
                    pending.clear();
                    self.start_server(&command, ready)?;
                }
                None => {
                    pending.push_str(line);
                    pending.push('\n');
                }
            }
        }
        if !pending.trim().is_empty() {
            printed.extend(self.run_script(&pending)?);
        }
        Ok(printed)
    }

    /// The servers' output, for a failure report.
    fn server_logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| format!("--- {}\n{}", s.command, s.output.lines().join("\n")))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Whether `got` is `expected` line by line: `…` within a line stands for any text, a line
/// of `…` alone for any number of lines. Trailing blank lines do not count.
fn output_matches(expected: &[&str], got: &[&str]) -> bool {
    match expected.split_first() {
        None => got.is_empty(),
        Some((&"…", rest)) => (0..=got.len()).any(|skip| output_matches(rest, &got[skip..])),
        Some((line, rest)) => got
            .split_first()
            .is_some_and(|(first, more)| line_matches(line, first) && output_matches(rest, more)),
    }
}

/// Whether `got` is `pattern`, `…` in it standing for any text.
fn line_matches(pattern: &str, got: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let [first, middle @ .., last] = parts.as_slice() else {
        return pattern == got;
    };
    let Some(mut rest) = got.strip_prefix(first) else {
        return false;
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Lines without trailing spaces, and without trailing blank lines.
fn trimmed_lines(lines: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut lines: Vec<String> = lines.into_iter().map(|l| l.trim_end().to_owned()).collect();
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    lines
}

/// Runs every example of the pages (a page's examples in order, in scenes as the module
/// header says); the failures, each with what it printed and what its servers logged.
fn run_examples(pages: &[(String, String)]) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut failures = Vec::new();
    for (page, text) in pages {
        let mut scene: Option<Scene> = None;
        for example in examples(page, text) {
            count += 1;
            let starts_servers = example.script.lines().any(|l| server_line(l).is_some());
            if starts_servers || scene.is_none() {
                // The old scene's servers stop before the new one's start.
                drop(scene.take());
                scene = Some(Scene::new());
            }
            let scene = scene.as_mut().expect("scene");
            let place = format!("{}:{}", example.page, example.line);
            let failure = match scene.run(&example.script) {
                Err(why) => Some(why),
                Ok(printed) => {
                    let got = trimmed_lines(printed);
                    // The output moves with the ports: a port the example names is printed
                    // as the scene's.
                    let expected = scene.rewrite(example.expected.as_deref().unwrap_or_default());
                    let expected = trimmed_lines(expected.lines().map(str::to_owned));
                    let got_refs: Vec<&str> = got.iter().map(String::as_str).collect();
                    let expected_refs: Vec<&str> = expected.iter().map(String::as_str).collect();
                    let checked = example.expected.is_some();
                    (checked && !output_matches(&expected_refs, &got_refs)).then(|| {
                        format!(
                            "printed:\n{}\n--- the page shows:\n{}",
                            got.join("\n"),
                            expected.join("\n")
                        )
                    })
                }
            };
            if let Some(why) = failure {
                failures.push(format!(
                    "{place}: the example fails: {why}\n--- its servers:\n{}",
                    scene.server_logs()
                ));
            }
        }
    }
    (count, failures)
}

/// The heart of issue 37's "the docs' examples run": a page whose example no longer works, or
/// prints something else than the page shows, fails here with the page and line.
#[test]
fn every_tested_shell_example_of_the_docs_runs_and_prints_what_the_page_shows() {
    let pages = pages();
    let (count, failures) = run_examples(&pages);
    assert!(
        count >= 10,
        "only {count} `sh tested` examples found: the fence or the pages moved"
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// The README's quick start and the getting-started page are run, not only some page:
/// marking them `sh tested` is what the issue asks for.
#[test]
fn the_quick_start_and_getting_started_examples_are_marked_to_run() {
    for page in ["README.md", "docs/getting-started.md"] {
        let text = std::fs::read_to_string(root().join(page)).expect("page");
        let examples = examples(page, &text);
        assert!(
            examples.iter().any(|e| e.script.contains("postbox &")
                && e.script.contains("mosquitto_sub")
                && e.expected.is_some()),
            "{page} has no tested quick start with its output"
        );
    }
}

/// A config snippet a reader copies must load: unknown keys, wrong types and values out of
/// range are what the loader rejects.
#[test]
fn every_toml_example_of_the_docs_is_a_valid_config() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (page, text) in pages() {
        for block in blocks(&text).into_iter().filter(|b| b.info == "toml") {
            count += 1;
            let origin = format!("{page}:{}", block.line);
            if let Err(e) = Config::from_toml_str(&block.text, &origin) {
                failures.push(format!("{origin}: {e}"));
            }
        }
    }
    assert!(count >= 6, "only {count} toml blocks found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A section header as written in the index: `[[listener]]`, `[listener.tls]`, `[mqtt]`.
fn toml_header(cell: &str) -> Option<String> {
    let header = cell.trim().trim_matches('`');
    (header.starts_with('[') && header.ends_with(']')).then(|| header.to_owned())
}

/// Whether the config loader knows `key` in `section` (of the index's spelling): it is given
/// a value of a type no key takes, and must complain about the value, not the key.
fn loader_knows(section: &str, key: &str, arrays: &BTreeSet<String>) -> bool {
    let name = section.trim_matches(|c| c == '[' || c == ']');
    let parent = name.split('.').next().unwrap_or(name);
    let mut snippet = String::new();
    if name.contains('.') && arrays.contains(parent) {
        snippet.push_str(&format!("[[{parent}]]\n"));
    }
    snippet.push_str(&format!("{section}\n{key} = 1979-05-27T07:32:00Z\n"));
    match Config::from_toml_str(&snippet, "probe") {
        Ok(_) => true,
        Err(e) => !e.to_string().contains("unknown key"),
    }
}

/// `docs/configuration.md`'s "Every key" table: section header -> keys.
fn key_index() -> BTreeMap<String, BTreeSet<String>> {
    let text =
        std::fs::read_to_string(root().join("docs/configuration.md")).expect("configuration.md");
    let index = text
        .split("## Every key")
        .nth(1)
        .expect("docs/configuration.md has an \"Every key\" section");
    let index = index.split("\n## ").next().unwrap_or(index);
    let mut sections = BTreeMap::new();
    for row in index.lines().filter(|l| l.starts_with("| `[")) {
        let cells: Vec<&str> = row.split('|').collect();
        let (Some(header), Some(keys)) = (cells.get(1).and_then(|c| toml_header(c)), cells.get(2))
        else {
            continue;
        };
        let keys = keys
            .split(',')
            .map(|k| k.trim().trim_matches('`').to_owned())
            .filter(|k| !k.is_empty())
            .collect();
        sections.insert(header, keys);
    }
    sections
}

/// The keys `config/postbox.toml` sets or shows commented out, with the section they are
/// under (an active key under the last active header; a commented one under the last
/// commented header if the loader knows it there, else under the active one), as the loader
/// judges them. Prose that happens to read `# word = ...` is not a key the loader knows.
fn postbox_toml_keys(arrays: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(root().join("config/postbox.toml")).expect("postbox.toml");
    let mut active = String::new();
    let mut commented: Option<String> = None;
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let (is_comment, body) = match line.strip_prefix("# ") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        if let Some(header) = toml_header(body.trim_end()) {
            if is_comment {
                commented = Some(header);
            } else {
                active = header;
                commented = None;
            }
            continue;
        }
        let Some((key, _)) = body.split_once(" = ") else {
            continue;
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            continue;
        }
        let candidates = match (&commented, is_comment) {
            (Some(section), true) => vec![section.clone(), active.clone()],
            _ => vec![active.clone()],
        };
        if let Some(section) = candidates
            .into_iter()
            .find(|s| !s.is_empty() && loader_knows(s, key, arrays))
        {
            keys.insert((section, key.to_owned()));
        }
    }
    keys
}

/// Issue 37: the configuration reference is "checked against `config/postbox.toml`": a key
/// added there without the index, or a key in the index the loader does not know, fails.
#[test]
fn the_configuration_index_lists_every_key_of_postbox_toml_and_only_real_keys() {
    let index = key_index();
    assert!(index.len() >= 10, "the index has {} sections", index.len());
    let arrays: BTreeSet<String> = index
        .keys()
        .filter(|h| h.starts_with("[["))
        .map(|h| h.trim_matches(|c| c == '[' || c == ']').to_owned())
        .collect();
    let mut unknown = Vec::new();
    for (section, keys) in &index {
        for key in keys {
            if !loader_knows(section, key, &arrays) {
                unknown.push(format!("{section} {key}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/configuration.md lists keys the config loader does not know: {unknown:?}"
    );
    let file_keys = postbox_toml_keys(&arrays);
    assert!(file_keys.len() >= 100, "{} keys read", file_keys.len());
    let missing: Vec<String> = file_keys
        .iter()
        .filter(|(section, key)| !index.get(section).is_some_and(|keys| keys.contains(key)))
        .map(|(section, key)| format!("{section} {key}"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md's index leaves out keys of config/postbox.toml: {missing:?}"
    );
}

/// The GitHub anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (outside fenced blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// Moving the README's sections into pages moved their anchors: a link to a file or heading
/// that is not there fails here.
#[test]
fn the_pages_relative_links_name_files_and_headings_that_exist() {
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let dir = root().join(&page).parent().map(Path::to_path_buf);
        let dir = dir.unwrap_or_else(|| root().to_path_buf());
        for target in text.split("](").skip(1).filter_map(|s| s.split(')').next()) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path: PathBuf = if file.is_empty() {
                root().join(&page)
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{page}: {target} (no such file)"));
                continue;
            }
            if !fragment.is_empty() && path.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&path).expect("linked page");
                if !anchors(&text).contains(fragment) {
                    broken.push(format!("{page}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every page of `docs/` is reachable from the README.
#[test]
fn the_readme_links_every_docs_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let unlinked: Vec<String> = pages()
        .into_iter()
        .map(|(page, _)| page)
        .filter(|page| page.starts_with("docs/") && !readme.contains(&format!("]({page}")))
        .collect();
    assert!(unlinked.is_empty(), "README links none of {unlinked:?}");
}

/// The comparison itself can fail: extra lines, other lines and misplaced text do not match.
#[test]
fn expected_output_matching_is_line_by_line_with_ellipses() {
    assert!(output_matches(&["a", "b"], &["a", "b"]));
    assert!(!output_matches(&["a", "b"], &["a", "b", "c"]));
    assert!(!output_matches(&["a"], &["b"]));
    assert!(output_matches(&["x …z"], &["x yyy z"]));
    assert!(!output_matches(&["x …z"], &["x yyy"]));
    assert!(output_matches(&["a", "…", "d"], &["a", "b", "c", "d"]));
    assert!(output_matches(&["a…b…c"], &["a1b2c"]));
    assert!(!output_matches(&["a…b…c"], &["a1c2b"]));
}
