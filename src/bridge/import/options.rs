//! The option tables of `bridge import`: which mosquitto.conf options belong to a
//! `connection` stanza, and what the user must know about those Postbox has no equivalent for.

/// Options of a `connection` stanza (mosquitto.conf(5), "Configuring Bridges", 2.0 and 2.1).
pub(super) const BRIDGE_OPTIONS: &[&str] = &[
    "address",
    "addresses",
    "bridge_alpn",
    "bridge_attempt_unsubscribe",
    "bridge_bind_address",
    "bridge_cafile",
    "bridge_capath",
    "bridge_certfile",
    "bridge_ciphers",
    "bridge_ciphers_tls1.3",
    "bridge_identity",
    "bridge_insecure",
    "bridge_keyfile",
    "bridge_max_packet_size",
    "bridge_max_topic_alias",
    "bridge_outgoing_retain",
    "bridge_protocol_version",
    "bridge_psk",
    "bridge_receive_maximum",
    "bridge_reload_type",
    "bridge_require_ocsp",
    "bridge_session_expiry_interval",
    "bridge_tcp_keepalive",
    "bridge_tcp_user_timeout",
    "bridge_tls_use_os_certs",
    "bridge_tls_version",
    "cleansession",
    "clientid",
    "idle_timeout",
    "keepalive_interval",
    "local_cleansession",
    "local_clientid",
    "local_password",
    "local_username",
    "notification_topic",
    "notifications",
    "notifications_local_only",
    "password",
    "remote_clientid",
    "remote_password",
    "remote_username",
    "restart_timeout",
    "round_robin",
    "start_type",
    "threshold",
    "topic",
    "try_private",
    "username",
];

/// Options Postbox has no equivalent for, and what that means for the user.
pub(super) const NOT_MAPPED: &[(&str, &str)] = &[
    (
        "bridge_attempt_unsubscribe",
        "Postbox does not send UNSUBSCRIBE for `out` rules",
    ),
    (
        "bridge_bind_address",
        "the operating system picks the source address",
    ),
    (
        "bridge_ciphers",
        "rustls offers its own safe cipher suites (TLS 1.2 and 1.3) and takes no list",
    ),
    (
        "bridge_ciphers_tls1.3",
        "rustls offers its own safe cipher suites (TLS 1.2 and 1.3) and takes no list",
    ),
    (
        "bridge_identity",
        "TLS-PSK is not supported (rustls has no PSK client): use certificates, or the \
         bridge cannot reach a PSK-only listener",
    ),
    (
        "bridge_psk",
        "TLS-PSK is not supported (rustls has no PSK client): use certificates, or the \
         bridge cannot reach a PSK-only listener",
    ),
    (
        "bridge_max_packet_size",
        "no per-bridge bound on packets sent; an MQTT 5 remote's Maximum Packet Size is \
         respected",
    ),
    (
        "bridge_max_topic_alias",
        "the bridge announces no topic aliases to the remote (Topic Alias Maximum 0)",
    ),
    (
        "bridge_receive_maximum",
        "no option for the Receive Maximum the bridge announces; `inflight` bounds the \
         other direction (messages sent to the remote and not yet acknowledged)",
    ),
    (
        "bridge_reload_type",
        "bridge settings are applied at start (SIGHUP does not reconnect)",
    ),
    ("bridge_require_ocsp", "OCSP is not checked"),
    (
        "bridge_tcp_keepalive",
        "no TCP keep-alive option; `keep_alive` (MQTT) detects a dead link",
    ),
    (
        "bridge_tcp_user_timeout",
        "no TCP_USER_TIMEOUT option; `keep_alive` (MQTT) detects a dead link",
    ),
    (
        "bridge_tls_version",
        "Postbox negotiates TLS 1.2 or 1.3 (the newest both sides speak) and cannot pin one",
    ),
    (
        "local_cleansession",
        "the bridge's local session ($bridge/<name>) is always durable: that is what keeps \
         queued messages across outages and restarts",
    ),
    (
        "local_clientid",
        "the bridge's local session is always `$bridge/<name>` (in-process, no socket)",
    ),
    (
        "local_password",
        "the bridge's local session is in-process and does not log in; the ACL applies to \
         it by its client id `$bridge/<name>`",
    ),
    (
        "local_username",
        "the bridge's local session is in-process and does not log in; the ACL applies to \
         it by its client id `$bridge/<name>`",
    ),
    (
        "notification_topic",
        "the link state is published on $SYS/broker/connection/<name>/state only",
    ),
    (
        "notifications_local_only",
        "with `notifications` the state is published locally and on the remote (as the \
         bridge's will); set `notifications = false` to publish neither",
    ),
];
