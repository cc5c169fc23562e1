//! The running ACL: the compiled file and its generation behind an `ArcSwap`, swapped whole on
//! reload, so a subscription granted under an older ACL is re-checked at delivery.
//!
//! Why an `ArcSwap` and not a lock: every PUBLISH and every checked delivery reads it, from
//! all workers at once; a read-write lock's counter is one cache line written by every
//! reader, bouncing between cores. Each worker thread keeps an `arc_swap::Cache` of the
//! current ACL: a check costs one relaxed load of the pointer (compared with the cached one)
//! instead of a full `ArcSwap` load (about 130 instructions, measured with callgrind). A reload
//! builds the new ACL first (file I/O and compiling, outside anything checks touch) and then
//! swaps the pointer, so checks never wait; a thread's next check picks the new one up.
//!
//! Must not: lock on the check path.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Cache};

use super::acl::{Acl, AclError, Action, Authorizer, FilterAccess, Identity};

/// One ACL and the generation it was installed as: swapped together, so a decision and the
/// generation it is stamped with always belong to each other.
#[derive(Debug)]
struct Installed {
    acl: Acl,
    generation: u32,
}

/// Each thread's cached view of the ACL slot it last checked with.
type LocalCache = Cache<Arc<ArcSwap<Installed>>, Arc<Installed>>;

thread_local! {
    static LOCAL: RefCell<Option<LocalCache>> = const { RefCell::new(None) };
}

/// The ACL in force and its generation (1 at start, +1 per successful reload).
#[derive(Debug)]
pub struct AclSlot {
    path: PathBuf,
    current: Arc<ArcSwap<Installed>>,
    /// The generation of `current`, stored after each swap: one plain load for callers that
    /// only need to know whether a decision they remember is still the ACL's
    /// ([`AclSlot::epoch`]).
    epoch: AtomicU32,
    reloading: parking_lot::Mutex<()>,
}

impl AclSlot {
    /// Loads `path` for the first time.
    ///
    /// # Errors
    ///
    /// The file cannot be read or a line is bad (file and line named): the broker must not
    /// start with an ACL it cannot read.
    pub fn load(path: PathBuf) -> Result<AclSlot, AclError> {
        let acl = Acl::load(&path)?;
        tracing::info!(file = %path.display(), rules = acl.rules(), "ACL loaded");
        Ok(AclSlot {
            path,
            current: Arc::new(ArcSwap::from_pointee(Installed { acl, generation: 1 })),
            epoch: AtomicU32::new(1),
            reloading: parking_lot::Mutex::new(()),
        })
    }

    /// Runs `f` on the ACL in force, through this thread's cache (see the module doc).
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&Installed) -> R) -> R {
        LOCAL.with(|local| {
            let Ok(mut local) = local.try_borrow_mut() else {
                return f(&self.current.load());
            };
            // One slot per process in the broker; tests run several brokers in one process,
            // so the cache is for one slot and is replaced when another one asks.
            let mine = local
                .as_ref()
                .is_some_and(|cache| std::ptr::eq(cache.arc_swap(), Arc::as_ptr(&self.current)));
            if !mine {
                *local = Some(Cache::new(Arc::clone(&self.current)));
            }
            match local.as_mut() {
                Some(cache) => f(cache.load()),
                None => f(&self.current.load()),
            }
        })
    }

    /// The generation in force, by one atomic load: for a decision remembered by its caller
    /// (a connection's last PUBLISH topic). Read it *before* deciding: a reload stores the new
    /// ACL first and the new epoch after it, so a decision stamped with the epoch read before
    /// it is never newer than its stamp, and is made again after any reload.
    #[inline]
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The generation checks and grants are stamped with.
    pub fn generation(&self) -> u32 {
        self.with(|installed| installed.generation)
    }

    /// One decision on a topic name. No lock, no allocation.
    pub fn allow(&self, identity: Identity<'_>, action: Action, topic: &str) -> bool {
        self.with(|installed| installed.acl.allow(identity, action, topic))
    }

    /// One decision on a subscription filter, with the generation it was made under.
    pub fn filter_access(&self, identity: Identity<'_>, filter: &str) -> (FilterAccess, u32) {
        self.with(|installed| {
            (
                installed.acl.filter_access(identity, filter),
                installed.generation,
            )
        })
    }
}

impl crate::reload::Reload for AclSlot {
    fn what(&self) -> String {
        format!("ACL file {}", self.path.display())
    }

    fn reload(&self) -> Result<(), String> {
        let acl = Acl::load(&self.path).map_err(|e| e.to_string())?;
        let rules = acl.rules();
        {
            // Writers only (two SIGHUPs at once must not lose a generation); checks never
            // take it.
            let _one_reload = self.reloading.lock();
            let generation = self.current.load().generation.wrapping_add(1);
            self.current.store(Arc::new(Installed { acl, generation }));
            self.epoch.store(generation, Ordering::Release);
        }
        tracing::info!(file = %self.path.display(), rules, "ACL reloaded");
        Ok(())
    }
}
