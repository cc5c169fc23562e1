//! Command-line overrides (`-p`, `--metrics-port`, `--data-dir`, `--cluster-node`), applied to
//! the loaded file and then validated with it.
//!
//! They live here rather than in `main.rs` so that an override is held to the same rules as
//! the file (a `-p` that clashes with the metrics port is a config error, not a bind failure),
//! and so that the error can say which flag set the value.

use std::path::PathBuf;

use super::{Config, ConfigError};

/// The environment variable that names the node when `--cluster-node` is absent: a pod spec
/// sets it from the pod's name as easily as a flag, and one ConfigMap serves every pod.
pub const CLUSTER_NODE_ENV: &str = "POSTBOX_CLUSTER_NODE";

/// Where a `cluster.node` override came from, so an error can name what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterNode {
    /// `--cluster-node <ID>`.
    Flag(String),
    /// `POSTBOX_CLUSTER_NODE=<ID>` (used only without the flag).
    Env(String),
}

impl ClusterNode {
    /// The node id given.
    pub fn id(&self) -> &str {
        match self {
            ClusterNode::Flag(id) | ClusterNode::Env(id) => id,
        }
    }

    /// How the user spelled it: `--cluster-node` or `POSTBOX_CLUSTER_NODE`.
    pub fn source(&self) -> &'static str {
        match self {
            ClusterNode::Flag(_) => "--cluster-node",
            ClusterNode::Env(_) => CLUSTER_NODE_ENV,
        }
    }
}

/// Values given on the command line that replace parts of the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Port of the first listener (`-p/--port`); its address stays as configured.
    pub port: Option<u16>,
    /// Port of `metrics.bind` (`--metrics-port`); 0 turns the metrics endpoint off.
    pub metrics_port: Option<u16>,
    /// `storage.dir` (`--data-dir`); also turns persistence on.
    pub data_dir: Option<PathBuf>,
    /// `cluster.node` (`--cluster-node`, else `POSTBOX_CLUSTER_NODE`): the one key that differs
    /// between the nodes of a cluster, so one file serves them all (every pod of a Kubernetes
    /// stateful set).
    pub cluster_node: Option<ClusterNode>,
}

impl Overrides {
    /// Writes the overridden values into `config` (without validating; see
    /// [`Config::load_with`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Override`] for a node id when the file has no `[cluster]` section: the
    /// flag names the node of a cluster, it does not make one (that needs `servers`, and a
    /// cluster that appears by accident would refuse QoS 1/2 while NATS is not there).
    pub fn apply(&self, config: &mut Config, origin: &str) -> Result<(), ConfigError> {
        if let (Some(port), Some(first)) = (self.port, config.listeners.first_mut()) {
            first.bind.set_port(port);
        }
        match self.metrics_port {
            Some(0) => config.metrics.enabled = false,
            Some(port) => {
                config.metrics.enabled = true;
                config.metrics.bind.set_port(port);
            }
            None => {}
        }
        if let Some(dir) = &self.data_dir {
            config.storage.dir = Some(dir.clone());
            config.storage.persistence = true;
        }
        if let Some(node) = &self.cluster_node {
            match &mut config.cluster {
                Some(cluster) => node.id().clone_into(&mut cluster.node),
                None => {
                    return Err(ConfigError::Override {
                        origin: origin.to_owned(),
                        message: format!(
                            "{} needs a [cluster] section (it only names this node of a cluster the file configures)",
                            node.source()
                        ),
                    })
                }
            }
        }
        Ok(())
    }

    /// "`listener[0].bind` has its port from `-p 9000`"-style notes for the overridden keys
    /// that `text` (an error's key and message) mentions; empty if none.
    pub(super) fn notes_for(&self, text: &str) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(port) = self.port {
            if text.contains("listener[0]") || text.contains("listener.bind") {
                notes.push(format!(
                    "the first listener's port is {port} from `-p {port}`"
                ));
            }
        }
        if let Some(port) = self.metrics_port {
            if text.contains("metrics.bind") {
                notes.push(format!(
                    "the metrics port is {port} from `--metrics-port {port}`"
                ));
            }
        }
        if let Some(dir) = &self.data_dir {
            if text.contains("storage.dir") {
                notes.push(format!(
                    "storage.dir is {} from `--data-dir`",
                    dir.display()
                ));
            }
        }
        if let Some(node) = &self.cluster_node {
            if text.contains("cluster.node") {
                notes.push(format!(
                    "cluster.node is {:?} from `{}`",
                    node.id(),
                    node.source()
                ));
            }
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::config_file;
    use super::*;

    const CLUSTER: &str = "[cluster]\nnode = \"file\"\nservers = [\"nats://127.0.0.1:4222\"]\n";

    fn load(text: &str, node: Option<ClusterNode>) -> Result<Config, ConfigError> {
        let (_dir, path) = config_file("node.toml", text);
        Config::load_with(
            Some(&path),
            &Overrides {
                cluster_node: node,
                ..Overrides::default()
            },
        )
    }

    fn node_of(config: &Config) -> &str {
        &config.cluster.as_ref().expect("[cluster]").node
    }

    /// The flag (or the variable) replaces the file's node id; the other keys stay.
    #[test]
    fn node_override_replaces_the_files_id() {
        let c = load(CLUSTER, None).expect("loads");
        assert_eq!(node_of(&c), "file");
        for node in [
            ClusterNode::Flag("postbox-0".into()),
            ClusterNode::Env("postbox-0".into()),
        ] {
            let c = load(CLUSTER, Some(node)).expect("loads");
            assert_eq!(node_of(&c), "postbox-0");
            assert_eq!(
                c.cluster.as_ref().expect("[cluster]").servers,
                ["nats://127.0.0.1:4222"]
            );
        }
        // A file without `node` is complete once the flag names the node.
        let c = load(
            "[cluster]\nservers = [\"nats://127.0.0.1:4222\"]\n",
            Some(ClusterNode::Flag("b".into())),
        )
        .expect("node from the flag");
        assert_eq!(node_of(&c), "b");
    }

    /// Validated exactly like the file's `node`, and the error says where the value came from.
    #[test]
    fn node_override_is_validated_and_named() {
        let too_long = "x".repeat(crate::config::MAX_NODE_ID_LEN + 1);
        for bad in ["", "a.b", "pod 0", too_long.as_str()] {
            let msg = load(CLUSTER, Some(ClusterNode::Flag(bad.to_owned())))
                .expect_err(bad)
                .to_string();
            assert!(
                msg.contains("cluster.node") && msg.contains("`--cluster-node`"),
                "{bad:?}: {msg}"
            );
            let msg = load(CLUSTER, Some(ClusterNode::Env(bad.to_owned())))
                .expect_err(bad)
                .to_string();
            assert!(msg.contains("`POSTBOX_CLUSTER_NODE`"), "{bad:?}: {msg}");
        }
        // The same id in the file is refused the same way, without a note about a flag.
        let msg = load("[cluster]\nnode = \"a.b\"\n", None)
            .expect_err("bad id in the file")
            .to_string();
        assert!(
            msg.contains("cluster.node") && !msg.contains("--cluster-node"),
            "{msg}"
        );
    }

    /// Without `[cluster]` the flag is an error naming it, not a silent single node.
    #[test]
    fn node_override_needs_a_cluster_section() {
        for (node, name) in [
            (ClusterNode::Flag("a".into()), "--cluster-node"),
            (ClusterNode::Env("a".into()), "POSTBOX_CLUSTER_NODE"),
        ] {
            let err = load("[mqtt]\nmax_qos = 1\n", Some(node)).expect_err("no [cluster]");
            assert!(matches!(err, ConfigError::Override { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("{name} needs a [cluster] section"))
                    && msg.contains("node.toml"),
                "{msg}"
            );
        }
        let err = Config::load_with(
            None,
            &Overrides {
                cluster_node: Some(ClusterNode::Flag("a".into())),
                ..Overrides::default()
            },
        )
        .expect_err("the embedded default has no [cluster]");
        assert!(err.to_string().contains("--cluster-node needs"), "{err}");
    }
}
