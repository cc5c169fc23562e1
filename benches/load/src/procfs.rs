//! What the kernel says about a process: CPU time, resident and peak memory; and raising our
//! own file-descriptor limit for the many-connections scenario.
//!
//! Reading `/proc/PID` costs the broker nothing, so its CPU and memory are measured from the
//! outside, the same way for every broker.

use std::fs;
use std::io;
use std::time::Instant;

/// CPU time of `pid` in seconds, all threads: nanosecond-precise from the threads'
/// `schedstat` when the kernel has it (threads that exit mid-run drop out of that sum, which
/// the brokers measured here do not do), else user + system ticks from `stat` (10 ms steps,
/// too coarse for sub-second runs).
///
/// # Errors
///
/// When `/proc/PID/stat` cannot be read or parsed (e.g. the process is gone).
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    match schedstat_seconds(pid) {
        Some(s) => Ok(s),
        None => stat_seconds(pid),
    }
}

/// Sum of the first `schedstat` field (time on CPU, ns) over every thread of `pid`.
fn schedstat_seconds(pid: u32) -> Option<f64> {
    let mut ns: u64 = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        // A thread may exit between listing and reading: skip it rather than fail.
        let Ok(text) = fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

/// User + system time from `/proc/PID/stat`, in seconds.
fn stat_seconds(pid: u32) -> io::Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Field 2 (comm) may contain spaces and parentheses: parse after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("unexpected /proc/PID/stat format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After comm: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let field = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::other("missing utime/stime in /proc/PID/stat"))
    };
    let ticks = field(11)? + field(12)?;
    Ok(ticks as f64 / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// A `VmXxx:` line of `/proc/PID/status` in KiB (`VmRSS` now, `VmHWM` peak).
///
/// # Errors
///
/// When the status file cannot be read, or has no `key` line.
pub fn status_kib(pid: u32, key: &str) -> io::Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix(key)?.strip_prefix(':')?;
            value.split_whitespace().next()?.parse().ok()
        })
        .ok_or_else(|| io::Error::other(format!("no {key} in /proc/{pid}/status")))
}

/// CPU used by a process over an interval, as a percentage of one core.
#[derive(Clone, Copy, Debug)]
pub struct CpuMeter {
    pid: u32,
    start_cpu: f64,
    start: Instant,
}

/// The result of a [`CpuMeter`].
#[derive(Clone, Copy, Debug)]
pub struct CpuUse {
    /// CPU seconds consumed over the interval.
    pub cpu_s: f64,
    /// `cpu_s` divided by the wall-clock interval, in percent of one core.
    pub pct: f64,
}

impl CpuMeter {
    /// Starts measuring `pid`; `None` if it cannot be read (no such process).
    pub fn start(pid: u32) -> Option<CpuMeter> {
        Some(CpuMeter {
            pid,
            start_cpu: cpu_seconds(pid).ok()?,
            start: Instant::now(),
        })
    }

    /// CPU used since `start`.
    pub fn stop(&self) -> Option<CpuUse> {
        let cpu_s = cpu_seconds(self.pid).ok()? - self.start_cpu;
        let wall = self.start.elapsed().as_secs_f64().max(1e-9);
        Some(CpuUse {
            cpu_s,
            pct: 100.0 * cpu_s / wall,
        })
    }
}

/// Raises this process's open-file limit (soft, and hard when allowed) to at least `want`.
/// Returns the soft limit in force afterwards.
///
/// # Errors
///
/// When the limit cannot be read or set.
pub fn raise_nofile(want: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur >= want {
        return Ok(lim.rlim_cur);
    }
    let nr_open = fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(lim.rlim_max);
    // Raising the hard limit needs CAP_SYS_RESOURCE; fall back to the current hard limit.
    let raised = libc::rlimit {
        rlim_cur: want.min(nr_open),
        rlim_max: lim.rlim_max.max(want.min(nr_open)),
    };
    // SAFETY: `raised` is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) } == 0 {
        return Ok(raised.rlim_cur);
    }
    let capped = libc::rlimit {
        rlim_cur: want.min(lim.rlim_max),
        rlim_max: lim.rlim_max,
    };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const capped) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(capped.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_ok());
        assert!(status_kib(me, "VmRSS").is_ok_and(|kb| kb > 0));
        assert!(status_kib(me, "VmHWM").is_ok());
        assert!(status_kib(me, "NoSuchKey").is_err());
    }
}
