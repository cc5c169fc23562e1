//! Which clients were told already: a refusal their library repeats on every reconnect is
//! logged once per client id an hour, not once per retry.
//!
//! Why: paho and MQTT.js ignore the Maximum Packet Size CONNACK announces; a message over it
//! is refused (v5 0x95), and their auto-reconnect sends it again about once a second,
//! forever: twenty identical log lines in twenty seconds buried everything else (issue 37,
//! item 6). The counter (`postbox_packets_too_large_total`) still counts each one.
//!
//! Must not: grow without bound (at most [`CAPACITY`] ids, the oldest forgotten first) or be
//! touched on any path but a refusal.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Client ids remembered at most.
const CAPACITY: usize = 1024;

/// How long a client counts as told.
const QUIET_FOR: Duration = Duration::from_secs(3600);

/// The ids told lately, oldest first, with when.
static TOLD: Mutex<VecDeque<(Box<str>, Instant)>> = Mutex::new(VecDeque::new());

/// True the first time `client_id` asks within [`QUIET_FOR`] (then log at a level a person
/// reads); false while it counts as told (log at debug).
pub(crate) fn first_time(client_id: &str, now: Instant) -> bool {
    let mut told = TOLD.lock();
    while told
        .front()
        .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= QUIET_FOR)
    {
        told.pop_front();
    }
    if told.iter().any(|(id, _)| &**id == client_id) {
        return false;
    }
    if told.len() >= CAPACITY {
        told.pop_front();
    }
    told.push_back((client_id.into(), now));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once an hour per id; another id is told at once; an hour later again. Ids of this test
    /// only (the list is process-wide).
    #[test]
    fn a_client_is_told_once_an_hour() {
        let start = Instant::now();
        assert!(first_time("told-once-a", start));
        assert!(!first_time("told-once-a", start + Duration::from_secs(1)));
        assert!(first_time("told-once-b", start + Duration::from_secs(2)));
        assert!(first_time(
            "told-once-a",
            start + QUIET_FOR + Duration::from_secs(1)
        ));
    }
}
