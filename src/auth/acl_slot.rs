//! The running ACL: the compiled file behind an `Arc` swapped whole on reload, and its
//! generation, so a subscription granted under an older ACL is re-checked at delivery.
//!
//! Why a lock around an `Arc` and not per-check state: a check takes the read lock, decides
//! and lets go (never across `.await`); a reload builds the new ACL outside the lock and only
//! swaps the pointer, so checks never wait for file I/O.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use super::acl::{Acl, AclError, Action, Authorizer, FilterAccess, Identity};

/// The ACL in force and its generation (1 at start, +1 per successful reload).
#[derive(Debug)]
pub struct AclSlot {
    path: PathBuf,
    current: RwLock<Arc<Acl>>,
    generation: AtomicU32,
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
            current: RwLock::new(Arc::new(acl)),
            generation: AtomicU32::new(1),
        })
    }

    /// The generation checks and grants are stamped with.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// One decision on a topic name.
    pub fn allow(&self, identity: Identity<'_>, action: Action, topic: &str) -> bool {
        self.current.read().allow(identity, action, topic)
    }

    /// One decision on a subscription filter, with the generation it was made under.
    pub fn filter_access(&self, identity: Identity<'_>, filter: &str) -> (FilterAccess, u32) {
        let acl = self.current.read();
        (acl.filter_access(identity, filter), self.generation())
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
            let mut current = self.current.write();
            *current = Arc::new(acl);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        tracing::info!(file = %self.path.display(), rules, "ACL reloaded");
        Ok(())
    }
}
