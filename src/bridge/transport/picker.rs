//! [`AddressPicker`]: which of a bridge's `addresses` to try, in which order, in a connect
//! cycle (mosquitto.conf(5), `round_robin`).
//!
//! - failover (`round_robin = false`, the default): the first address is the main one; every
//!   cycle tries the addresses from the first on, so the bridge returns to the main remote
//!   as soon as it is back (Mosquitto, connected to a secondary, also probes the main one
//!   every 5 s and moves back; that probing is the engine's, this only orders the cycles).
//! - `round_robin = true`: the addresses are equals; a cycle starts with the address after
//!   the one that last worked (Mosquitto moves `cur_address` on when a connection is lost)
//!   and wraps around, so a remote that dropped the bridge is tried last.

/// The addresses of one bridge and which one last worked.
#[derive(Debug, Clone)]
pub struct AddressPicker {
    addresses: Vec<String>,
    round_robin: bool,
    last_success: Option<usize>,
}

impl AddressPicker {
    /// A picker over `addresses` (the config's order), failover or `round_robin`.
    pub fn new(addresses: Vec<String>, round_robin: bool) -> Self {
        AddressPicker {
            addresses,
            round_robin,
            last_success: None,
        }
    }

    /// The indexes to try in this connect cycle, in order; each address once.
    pub fn order(&self) -> Vec<usize> {
        let n = self.addresses.len();
        let start = match self.last_success {
            Some(last) if self.round_robin && n > 0 => (last + 1) % n,
            _ => 0,
        };
        (start..n).chain(0..start).collect()
    }

    /// The address at `index` (from [`AddressPicker::order`]).
    ///
    /// # Panics
    ///
    /// If `index` is not an index of the addresses.
    pub fn address(&self, index: usize) -> &str {
        &self.addresses[index]
    }

    /// Records that the connection to `index` worked (the next cycles start after it with
    /// `round_robin`).
    pub fn succeeded(&mut self, index: usize) {
        if index < self.addresses.len() {
            self.last_success = Some(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picker(n: usize, round_robin: bool) -> AddressPicker {
        AddressPicker::new(
            (0..n).map(|i| format!("host{i}:1883")).collect(),
            round_robin,
        )
    }

    #[test]
    fn failover_always_starts_from_the_first() {
        let mut p = picker(3, false);
        assert_eq!(p.order(), [0, 1, 2]);
        p.succeeded(2);
        assert_eq!(
            p.order(),
            [0, 1, 2],
            "the main address is tried first again"
        );
        p.succeeded(1);
        assert_eq!(p.order(), [0, 1, 2]);
        assert_eq!(p.address(1), "host1:1883");
    }

    #[test]
    fn round_robin_starts_after_the_last_success() {
        let mut p = picker(3, true);
        assert_eq!(p.order(), [0, 1, 2], "nothing worked yet: from the first");
        p.succeeded(0);
        assert_eq!(p.order(), [1, 2, 0]);
        p.succeeded(1);
        assert_eq!(p.order(), [2, 0, 1]);
        p.succeeded(2);
        assert_eq!(p.order(), [0, 1, 2], "wraps around");
    }

    #[test]
    fn degenerate_lists() {
        let mut one = picker(1, true);
        one.succeeded(0);
        assert_eq!(one.order(), [0]);
        let mut none = picker(0, true);
        none.succeeded(0);
        assert!(none.order().is_empty());
    }
}
