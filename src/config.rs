//! TEMPORARY stand-in (replaced on merge).
use std::net::SocketAddr;
use std::path::PathBuf;

/// Config.
#[derive(Clone, Debug)]
pub struct Config {
    pub listener: ListenerConfig,
    pub metrics: MetricsConfig,
    pub mqtt: MqttConfig,
    pub auth: AuthConfig,
    pub storage: StorageConfig,
    pub log: LogConfig,
}
/// x
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    pub bind: SocketAddr,
    pub max_connections: usize,
}
/// x
#[derive(Clone, Debug)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub bind: SocketAddr,
}
/// x
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverflowPolicy {
    DropNew,
    DropOldest,
}
/// x
#[derive(Clone, Debug)]
pub struct MqttConfig {
    pub max_packet_size: u32,
    pub max_keepalive: u16,
    pub max_inflight_messages: u16,
    pub max_queued_messages: usize,
    pub max_queued_bytes: usize,
    pub queue_qos0_messages: bool,
    pub queue_overflow: OverflowPolicy,
    pub retain_available: bool,
    pub max_qos: u8,
    pub allow_zero_length_clientid: bool,
    pub max_client_id_len: usize,
    pub session_expiry_interval_max: u32,
}
/// x
#[derive(Clone, Debug)]
pub struct AuthConfig {
    pub allow_anonymous: bool,
}
/// x
#[derive(Clone, Debug)]
pub struct StorageConfig {
    pub dir: Option<PathBuf>,
}
/// x
#[derive(Clone, Debug)]
pub struct LogConfig {
    pub level: String,
}
impl Default for Config {
    fn default() -> Self {
        Config {
            listener: ListenerConfig {
                bind: "0.0.0.0:1883".parse().unwrap(),
                max_connections: 0,
            },
            metrics: MetricsConfig {
                enabled: true,
                bind: "0.0.0.0:9883".parse().unwrap(),
            },
            mqtt: MqttConfig {
                max_packet_size: 1 << 20,
                max_keepalive: 65535,
                max_inflight_messages: 20,
                max_queued_messages: 1000,
                max_queued_bytes: 0,
                queue_qos0_messages: false,
                queue_overflow: OverflowPolicy::DropNew,
                retain_available: true,
                max_qos: 2,
                allow_zero_length_clientid: true,
                max_client_id_len: 65535,
                session_expiry_interval_max: u32::MAX,
            },
            auth: AuthConfig {
                allow_anonymous: true,
            },
            storage: StorageConfig { dir: None },
            log: LogConfig {
                level: "info".into(),
            },
        }
    }
}
impl Config {
    /// x
    pub fn embedded_default() -> Config {
        Config::default()
    }
}
impl Config {
    /// x
    pub fn load(_p: &std::path::Path) -> Result<Config, String> {
        Ok(Config::default())
    }
}
