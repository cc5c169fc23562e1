//! `postbox bridge import` through the real binary: the TOML on stdout loads as a Postbox
//! config with the stanza's meaning, the notes on stderr name file and line, and a file that
//! cannot be read is a clear error with a non-zero exit.

use std::process::Command;

use postbox::config::{Config, Direction};

const BIN: &str = crate::common::process::BIN;

/// What `postbox bridge import <file>` printed and how it ended.
fn bridge_import(file: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(["bridge", "import"])
        .arg(file)
        .output()
        .expect("runs")
}

#[test]
fn imports_a_mosquitto_conf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("mosquitto.conf");
    std::fs::write(
        &conf,
        "listener 1883\n\
         # to the cloud\n\
         connection cloud\n\
         address 127.0.0.1:1884\n\
         remote_clientid gw1\n\
         start_type once\n\
         topic sensors/# out 1 \"\" site1/\n\
         topic commands/# in 1\n",
    )
    .expect("write");
    let out = bridge_import(&conf);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let config =
        Config::from_toml_str(&stdout, "stdout").unwrap_or_else(|e| panic!("{e}\n{stdout}"));
    // Ends its last line, so `>> postbox.toml` appends cleanly.
    assert!(
        stdout.ends_with('\n') && !stdout.ends_with("\n\n"),
        "{stdout:?}"
    );
    let bridge = &config.bridges[0];
    assert_eq!(bridge.name, "cloud");
    assert_eq!(bridge.addresses, ["127.0.0.1:1884"]);
    assert_eq!(bridge.topics[0].remote_filter(), "site1/sensors/#");
    assert_eq!(bridge.topics[1].direction, Direction::In);
    let note = format!("note: {}:6: ", conf.display());
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with(&note) && l.contains("start_type once")),
        "{stderr}"
    );
    assert!(
        stderr.contains("lines 1"),
        "the listener line is summed up: {stderr}"
    );
    assert!(!stderr.contains("warning:"), "{stderr}");
}

#[test]
fn an_unreadable_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.conf");
    let out = bridge_import(&missing);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot read {}", missing.display())),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn an_incomplete_stanza_is_imported_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("m.conf");
    std::fs::write(&conf, "connection lonely\naddress h\n").expect("write");
    let out = bridge_import(&conf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("has no topic line"), "{stderr}");
    assert!(
        stderr.contains("warning: the imported TOML does not load as it is")
            && stderr.contains("bridge[0].topic"),
        "{stderr}"
    );
}
