//! Each source address's share of the hash workers (issue 35, finding 4): a verification
//! takes a place in its address's queue (IPv4 address, IPv6 /64) before it may wait for a
//! worker, and an address has `workers / 2` places (at least one). The workers' own queue is
//! first come, first served, so before this 300 wrong passwords from one address sat ahead
//! of every other client's login; now at most an address's share waits there, and a login
//! from elsewhere gets a worker after at most that many hashes (none, with two or more
//! workers: one is always out of a single address's reach).
//!
//! An address's queue exists only while one of its verifications is in flight (a count of
//! users under the map's lock), so the map is bounded by the handshakes under way.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The queues of the addresses with verifications in flight.
#[derive(Debug)]
pub(crate) struct HashShares {
    per_source: usize,
    queues: Arc<Mutex<HashMap<IpAddr, Queue>>>,
}

#[derive(Debug)]
struct Queue {
    places: Arc<Semaphore>,
    users: usize,
}

impl HashShares {
    /// Shares of `workers` hash workers.
    pub(crate) fn new(workers: usize) -> HashShares {
        HashShares {
            per_source: (workers / 2).max(1),
            queues: Arc::default(),
        }
    }

    /// Places each source has.
    pub(crate) fn per_source(&self) -> usize {
        self.per_source
    }

    /// Waits for a place in `source`'s share, unless `most` of its verifications are in
    /// flight already (`None`: its places cannot get to another in time); held until the
    /// hash it allows has finished (the place moves into the blocking task), and after a
    /// failure until its padded answer (`PasswordStore::verify`). Dropping the future gives
    /// the place up.
    pub(crate) async fn acquire(&self, source: IpAddr, most: usize) -> Option<Share> {
        let places = {
            let mut queues = self.queues.lock();
            let queue = queues.entry(source).or_insert_with(|| Queue {
                places: Arc::new(Semaphore::new(self.per_source)),
                users: 0,
            });
            if queue.users >= most {
                return None;
            }
            queue.users += 1;
            Arc::clone(&queue.places)
        };
        // Made before the wait: dropping the future while it waits gives the place up too.
        let mut share = Share {
            queues: Arc::clone(&self.queues),
            source,
            permit: None,
        };
        // Never closed; `None` would only let the hash run without a place.
        share.permit = places.acquire_owned().await.ok();
        Some(share)
    }

    /// Addresses with a queue now.
    #[cfg(test)]
    fn sources(&self) -> usize {
        self.queues.lock().len()
    }
}

/// A place in a source address's share of the hash workers (see [`HashShares::acquire`]).
#[derive(Debug)]
pub(crate) struct Share {
    queues: Arc<Mutex<HashMap<IpAddr, Queue>>>,
    source: IpAddr,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut queues = self.queues.lock();
        drop(self.permit.take());
        if let Some(queue) = queues.get_mut(&self.source) {
            queue.users = queue.users.saturating_sub(1);
            if queue.users == 0 {
                queues.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `f` once: whether it is still pending (a zero timeout polls its future first).
    async fn pending<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
        tokio::time::timeout(std::time::Duration::ZERO, f)
            .await
            .is_err()
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));
    /// No bound on the verifications in flight.
    const MANY: usize = usize::MAX;

    #[tokio::test]
    async fn an_address_waits_for_its_own_places_only_and_queues_go_with_their_users() {
        let shares = HashShares::new(2);
        let first = shares.acquire(A, MANY).await.expect("room");
        // A's one place is taken: a second verification from A waits…
        let mut second = Box::pin(shares.acquire(A, MANY));
        assert!(pending(second.as_mut()).await);
        // … while B gets its place at once.
        let b = shares.acquire(B, MANY).await.expect("room");
        assert_eq!(shares.sources(), 2);
        drop(first);
        let second = second.await.expect("room");
        drop((second, b));
        assert_eq!(
            shares.sources(),
            0,
            "no verification in flight: no queue kept"
        );

        // A waiter that gives up leaves nothing behind either.
        let held = shares.acquire(A, MANY).await.expect("room");
        let mut gave_up = Box::pin(shares.acquire(A, MANY));
        assert!(pending(gave_up.as_mut()).await);
        drop(gave_up);
        drop(held);
        assert_eq!(shares.sources(), 0);
    }

    /// Twenty-sixth adversarial pass, L1: a source may have no more verifications in flight
    /// than its places can get to in time; past that it gets `None` (answered busy), and a
    /// place given back lets the next in.
    #[tokio::test]
    async fn a_source_waits_at_most_as_many_as_its_places_get_to() {
        let shares = HashShares::new(2);
        let first = shares.acquire(A, 2).await.expect("room");
        let mut second = Box::pin(shares.acquire(A, 2));
        assert!(pending(second.as_mut()).await, "waits for A's place");
        assert!(
            shares.acquire(A, 2).await.is_none(),
            "a third is past the bound"
        );
        assert!(
            shares.acquire(B, 2).await.is_some(),
            "another source is not"
        );
        drop(first);
        assert!(second.await.is_some());
    }
}
