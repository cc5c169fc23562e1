//! Room for many sockets: the open-file limit and the kernel's file-descriptor table.
//!
//! Two things stand between a broker and a connection storm on Linux. The soft `RLIMIT_NOFILE`
//! (often 1024) refuses sockets long before the hard limit does, so it is raised to the hard
//! limit, as most servers do. And the kernel grows a process's descriptor table by doubling
//! it; in a multi-threaded process every doubling waits for an RCU grace period inside
//! `accept4` (`expand_files` → `synchronize_rcu`), 8–13 ms each on the test VMs: going from 64
//! to 16k descriptors stalled accepts for about 100 ms, a fifth of a 10k-client connect storm.
//! Growing the table once at start-up, while nothing is connected, removes those stalls.

/// Largest descriptor table grown in advance: about 8 bytes of kernel memory per slot, so a
/// huge hard limit does not reserve megabytes nobody uses; beyond this the kernel grows the
/// table on demand as before.
const MAX_PREGROWN_FDS: u64 = 1 << 20;

/// What start-up did to the limits, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdCapacity {
    /// The soft open-file limit now in force.
    pub soft_limit: u64,
    /// Descriptors the kernel table holds without growing.
    pub pregrown: u64,
}

/// Raises the soft open-file limit to the hard limit and grows the descriptor table to match
/// (at most [`MAX_PREGROWN_FDS`]). Best effort: on any failure the process keeps its limits
/// and the kernel grows the table on demand.
#[cfg(target_os = "linux")]
pub fn prepare() -> Option<FdCapacity> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid `rlimit` we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit only reads the valid `rlimit` we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    #[allow(clippy::unnecessary_cast, trivial_numeric_casts)]
    // rlim_t is u64 on 64-bit Linux, not everywhere
    let soft_limit = limit.rlim_cur as u64;
    let target = soft_limit.min(MAX_PREGROWN_FDS);
    let pregrown = if target > 64 && grow_table_to(target - 1) {
        target
    } else {
        0
    };
    Some(FdCapacity {
        soft_limit,
        pregrown,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn prepare() -> Option<FdCapacity> {
    None
}

/// Makes the kernel size the descriptor table for `highest`: duplicate stdin-or-any open
/// descriptor onto that number, then close it again.
#[cfg(target_os = "linux")]
fn grow_table_to(highest: u64) -> bool {
    let Ok(highest) = libc::c_int::try_from(highest) else {
        return false;
    };
    // Any descriptor we own will do; a fresh one avoids depending on stdin being open.
    let Ok(probe) = std::fs::File::open("/dev/null") else {
        return false;
    };
    use std::os::fd::AsRawFd;
    // SAFETY: `probe` is an open descriptor owned by this function. `highest` is below the
    // soft limit, and only used when it is not already open (F_GETFD fails with EBADF), so
    // dup2 cannot replace a descriptor someone else owns; the duplicate is closed at once.
    unsafe {
        if libc::fcntl(highest, libc::F_GETFD) != -1 {
            return true; // already open, so the table is already that large
        }
        if libc::dup2(probe.as_raw_fd(), highest) != highest {
            return false;
        }
        libc::close(highest);
    }
    true
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn raises_the_soft_limit_and_grows_the_table() {
        let capacity = prepare().expect("getrlimit works on Linux");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the valid `rlimit` we pass.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) },
            0
        );
        #[allow(clippy::unnecessary_cast, trivial_numeric_casts)]
        // rlim_t is u64 on 64-bit Linux, not everywhere
        let soft = limit.rlim_cur as u64;
        assert_eq!(capacity.soft_limit, soft);
        assert_eq!(limit.rlim_cur, limit.rlim_max, "soft limit raised to hard");
        if capacity.soft_limit > 64 {
            assert_eq!(capacity.pregrown, capacity.soft_limit.min(MAX_PREGROWN_FDS));
            // The highest slot is free again: the probe descriptor was closed.
            let highest = (capacity.pregrown - 1) as libc::c_int;
            // SAFETY: F_GETFD on a possibly closed descriptor only reads its flags.
            assert_eq!(unsafe { libc::fcntl(highest, libc::F_GETFD) }, -1);
        }
    }
}
