//! The running ACL: the compiled file and its generation behind an `ArcSwap`, swapped whole on
//! reload, so a subscription granted under an older ACL is re-checked at delivery.
//!
//! Why an `ArcSwap` and not a lock: every PUBLISH and every checked delivery reads it, from
//! all workers at once; a read-write lock's counter is one cache line written by every
//! reader, bouncing between cores. An `ArcSwap` load writes only the reading thread's own
//! slot. A reload builds the new ACL first (file I/O and compiling, outside anything checks
//! touch) and then swaps the pointer, so checks never wait.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::acl::{Acl, AclError, Action, Authorizer, FilterAccess, Identity};

/// One ACL and the generation it was installed as: swapped together, so a decision and the
/// generation it is stamped with always belong to each other.
#[derive(Debug)]
struct Installed {
    acl: Acl,
    generation: u32,
}

/// The ACL in force and its generation (1 at start, +1 per successful reload).
#[derive(Debug)]
pub struct AclSlot {
    path: PathBuf,
    current: ArcSwap<Installed>,
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
            current: ArcSwap::from_pointee(Installed { acl, generation: 1 }),
            reloading: parking_lot::Mutex::new(()),
        })
    }

    /// The generation checks and grants are stamped with.
    pub fn generation(&self) -> u32 {
        self.current.load().generation
    }

    /// One decision on a topic name. No lock, no allocation.
    pub fn allow(&self, identity: Identity<'_>, action: Action, topic: &str) -> bool {
        self.current.load().acl.allow(identity, action, topic)
    }

    /// One decision on a subscription filter, with the generation it was made under.
    pub fn filter_access(&self, identity: Identity<'_>, filter: &str) -> (FilterAccess, u32) {
        let installed = self.current.load();
        (
            installed.acl.filter_access(identity, filter),
            installed.generation,
        )
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
        }
        tracing::info!(file = %self.path.display(), rules, "ACL reloaded");
        Ok(())
    }
}
