//! Every TOML file shipped under `config/` must load: a documented example that does not parse
//! is worse than none. The deployment ConfigMap embeds a copy of the default file, so it is
//! checked too.

use std::path::{Path, PathBuf};

use postbox::config::Config;

/// All `*.toml` files below `dir`, sorted so failures are reported in a stable order.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "toml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_config_file_parses() {
    let files = toml_files(&root().join("config"));
    assert!(
        files.len() >= 3,
        "expected postbox.toml and two examples, found {files:?}"
    );
    for file in &files {
        if let Err(e) = Config::load(file) {
            panic!("{e}");
        }
    }
}

/// Every file a shipped config names is found beside it (relative paths in a config file are
/// read from its directory), so each example runs from any working directory: loading them
/// gives no note of a path found only from the working directory, which here is the
/// repository root, where paths written as before (`config/acl.example`) would be found
/// (issue 37, item 3).
#[test]
fn every_config_file_names_its_files_from_its_own_directory() {
    for file in toml_files(&root().join("config"))
        .into_iter()
        .chain([root().join("deploy/container/postbox.toml")])
    {
        let (_, notes) =
            Config::load_noting(Some(&file), &Default::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(notes.is_empty(), "{}: {notes:?}", file.display());
    }
}

#[test]
fn default_file_is_the_embedded_default() {
    let file = Config::load(&root().join("config/postbox.toml")).expect("postbox.toml loads");
    assert_eq!(file, Config::default());
    assert_eq!(file, Config::embedded_default());
}

#[test]
fn examples_differ_from_default() {
    for file in toml_files(&root().join("config/examples")) {
        let c = Config::load(&file).expect("example loads");
        assert_ne!(c, Config::default(), "{} sets nothing", file.display());
    }
}

/// The Kubernetes ConfigMap carries its own postbox.toml; it must be a valid config too.
#[test]
fn kubernetes_configmap_config_parses() {
    let path = root().join("deploy/kubernetes/configmap.yaml");
    let yaml = std::fs::read_to_string(&path).expect("configmap.yaml exists");
    let marker = "postbox.toml: |";
    let start = yaml.find(marker).expect("configmap has a postbox.toml key") + marker.len();
    let mut text = String::new();
    for line in yaml[start..].lines().skip(1) {
        if line.trim().is_empty() {
            text.push('\n');
            continue;
        }
        match line.strip_prefix("    ") {
            Some(rest) => {
                text.push_str(rest);
                text.push('\n');
            }
            None => break, // back at a shallower indentation: end of the block scalar
        }
    }
    assert!(
        text.contains("[storage]"),
        "block scalar not extracted:\n{text}"
    );
    match Config::from_toml_str(&text, &path.display().to_string()) {
        Ok(c) => assert!(
            c.storage.dir.is_some(),
            "Kubernetes config must use the volume"
        ),
        Err(e) => panic!("{e}"),
    }
}

/// `config/bridge.toml` is the ready example: local listener on 1883, a bridge to
/// 127.0.0.1:1884, `sensors/#` out under `site1/`, `commands/#` in, QoS 1, a durable store.
#[test]
fn bridge_example_is_the_documented_gateway() {
    use postbox::config::Direction;
    let c = Config::load(&root().join("config/bridge.toml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.listeners[0].bind.port(), 1883);
    assert_eq!(c.metrics.bind, Config::default().metrics.bind);
    assert!(c.storage.persistence && c.storage.dir.is_some());
    let [bridge] = c.bridges.as_slice() else {
        panic!("one bridge expected: {:?}", c.bridges)
    };
    assert_eq!(bridge.addresses, ["127.0.0.1:1884"]);
    let rules: Vec<(String, Direction, u8, String)> = bridge
        .topics
        .iter()
        .map(|t| (t.local_filter(), t.direction, t.qos, t.remote_filter()))
        .collect();
    assert_eq!(
        rules,
        [
            (
                "sensors/#".to_owned(),
                Direction::Out,
                1,
                "site1/sensors/#".to_owned()
            ),
            (
                "commands/#".to_owned(),
                Direction::In,
                1,
                "commands/#".to_owned()
            ),
        ]
    );
}

/// `postbox bridge import` turns the stanza quoted at the end of `config/bridge.toml` into
/// the same bridge the file defines (the comment stays true).
#[test]
fn bridge_example_matches_its_mosquitto_stanza() {
    let text = std::fs::read_to_string(root().join("config/bridge.toml")).expect("read");
    let start = text.find("#   connection cloud").expect("stanza quoted");
    let stanza: String = text[start..]
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .map(|l| format!("{l}\n"))
        .collect();
    let imported = postbox::test_support::bridge::import::import(&stanza, "stanza");
    let from_stanza = Config::from_toml_str(&imported.toml, "imported")
        .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
    let example = Config::load(&root().join("config/bridge.toml")).expect("loads");
    let mut expected = example.bridges[0].clone();
    // What the stanza cannot say: Postbox's own queue bound and replay rate.
    let defaults = postbox::config::BridgeConfig::default();
    expected.max_queued_messages = defaults.max_queued_messages;
    expected.max_queued_bytes = defaults.max_queued_bytes;
    expected.max_forward_rate = defaults.max_forward_rate;
    assert_eq!(from_stanza.bridges, [expected]);
}
