//! Per-node system metrics for the launcher to log every few seconds:
//! [`SystemSampler::sample`] returns `(key, value)` pairs, cheap enough to
//! call often (a few hundred microseconds without GPUs).
//!
//! Keys are stable; the launcher logs them as metrics of the tracking run.
//!
//! | key | value |
//! |---|---|
//! | `system/cpu_percent` | busy share of all CPUs of the node since the previous sample, 0-100 |
//! | `system/load1` | 1-minute load average |
//! | `system/memory_used_bytes` | total minus available memory (`MemAvailable`) |
//! | `system/memory_percent` | the same as a share of total memory, 0-100 |
//! | `system/swap_used_bytes` | total minus free swap |
//! | `system/disk_used_percent` | of the filesystem holding the sampler's path, as `df` shows it, 0-100 |
//! | `system/disk_free_bytes` | bytes that an unprivileged user can still write there |
//! | `system/disk_read_bytes_per_s` | read from the node's physical block devices |
//! | `system/disk_write_bytes_per_s` | written to them |
//! | `system/net_rx_bytes_per_s` | received on all interfaces but `lo` |
//! | `system/net_tx_bytes_per_s` | sent on them |
//! | `system/process_count` | processes visible in `/proc` |
//! | `gpu/{i}/utilization_percent` | time a kernel ran over NVML's last sample period, 0-100 |
//! | `gpu/{i}/memory_used_bytes` | allocated device memory |
//! | `gpu/{i}/memory_percent` | the same as a share of installed memory, 0-100 |
//! | `gpu/{i}/temperature_c` | core temperature, degrees Celsius |
//! | `gpu/{i}/power_watts` | power draw |
//!
//! The first sample primes the counters, so it has no rates (`cpu_percent`
//! and the `_per_s` keys); later ones report rates over the time since the
//! previous sample. `cpu_percent` is left out of a sample that comes less
//! than [`MIN_CPU_INTERVAL`] after the one that last measured it.
//!
//! GPU `i` is NVML's index, which follows PCI bus order (CUDA's order only
//! with `CUDA_DEVICE_ORDER=PCI_BUS_ID`). NVML is loaded at run time from
//! `libnvidia-ml.so.1`; without it there are no `gpu/` keys and
//! [`SystemSampler::gpu_status`] says why. A value that a GPU or the node
//! cannot report is left out; a sample never fails.
//!
//! Disk traffic counts whole devices that have a `/sys/block/NAME/device`
//! (disks, NVMe, virtio), so partitions, loop, RAM and device-mapper or md
//! devices stacked on them are not counted twice. Network filesystems show
//! up as network traffic; InfiniBand/RDMA traffic is not counted.

/// Whether `key` is one the launcher logs from this sampler (the rule
/// lives in `relaunch-api`, which the server applies too).
pub use relaunch_api::names::step_is_wall_millis;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use sysinfo::{MemoryRefreshKind, System};

pub const CPU_PERCENT: &str = "system/cpu_percent";
pub const LOAD1: &str = "system/load1";
pub const MEMORY_USED_BYTES: &str = "system/memory_used_bytes";
pub const MEMORY_PERCENT: &str = "system/memory_percent";
pub const SWAP_USED_BYTES: &str = "system/swap_used_bytes";
pub const DISK_USED_PERCENT: &str = "system/disk_used_percent";
pub const DISK_FREE_BYTES: &str = "system/disk_free_bytes";
pub const DISK_READ_BYTES_PER_S: &str = "system/disk_read_bytes_per_s";
pub const DISK_WRITE_BYTES_PER_S: &str = "system/disk_write_bytes_per_s";
pub const NET_RX_BYTES_PER_S: &str = "system/net_rx_bytes_per_s";
pub const NET_TX_BYTES_PER_S: &str = "system/net_tx_bytes_per_s";
pub const PROCESS_COUNT: &str = "system/process_count";

/// The shortest gap between two samples that both carry `cpu_percent`:
/// sysinfo keeps its previous reading when asked again sooner.
pub const MIN_CPU_INTERVAL: Duration = sysinfo::MINIMUM_CPU_UPDATE_INTERVAL;

/// The library NVML lives in; the driver installs it.
const NVML_LIB: &str = "libnvidia-ml.so.1";

/// `/proc/diskstats` counts 512-byte sectors whatever the device's own size.
const SECTOR_BYTES: u64 = 512;

/// Samples one node's CPU, memory, disk, network, processes and GPUs.
#[derive(Debug)]
pub struct SystemSampler {
    system: System,
    disk_path: PathBuf,
    gpus: Gpus,
    /// When sysinfo last read CPU times; `None` before the first sample.
    cpu_read_at: Option<Instant>,
    /// The previous sample's counters; `None` before the first sample.
    previous: Option<Counters>,
    /// Whether a `/sys/block` name is a physical device, looked up once.
    physical_disks: HashMap<String, bool>,
}

impl SystemSampler {
    /// `disk_path`: the filesystem whose usage to report (the job's working dir).
    ///
    /// Starts NVML when the node has it, which can take a moment.
    pub fn new(disk_path: &Path) -> Self {
        Self::with_nvml_lib(disk_path, OsStr::new(NVML_LIB))
    }

    fn with_nvml_lib(disk_path: &Path, nvml_lib: &OsStr) -> Self {
        Self {
            system: System::new(),
            disk_path: disk_path.to_path_buf(),
            gpus: Gpus::open(nvml_lib),
            cpu_read_at: None,
            previous: None,
            physical_disks: HashMap::new(),
        }
    }

    /// Values since the previous call (rates over the elapsed interval); the
    /// first call primes rates and returns the instantaneous ones only.
    pub fn sample(&mut self) -> Vec<(String, f64)> {
        let mut out = Vec::with_capacity(16 + 5 * self.gpus.count as usize);
        let mut put = |key: &str, value: f64| out.push((key.to_owned(), value));

        self.sample_cpu(&mut put);
        self.sample_memory(&mut put);
        self.sample_disk_space(&mut put);
        self.sample_traffic(&mut put);
        if let Some(count) = process_count() {
            put(PROCESS_COUNT, count as f64);
        }
        self.gpus.sample(&mut out);
        out
    }

    /// What GPU support found, for one log line: e.g. "NVML: 8 GPUs (driver
    /// 550.54)" or "no NVIDIA GPU (libnvidia-ml.so.1: cannot open shared
    /// object file: No such file or directory)".
    pub fn gpu_status(&self) -> &str {
        &self.gpus.status
    }

    fn sample_cpu(&mut self, put: &mut impl FnMut(&str, f64)) {
        let due = self
            .cpu_read_at
            .is_none_or(|at| at.elapsed() >= MIN_CPU_INTERVAL);
        if due {
            self.system.refresh_cpu_usage();
            if self.cpu_read_at.is_some() {
                put(
                    CPU_PERCENT,
                    f64::from(self.system.global_cpu_usage()).clamp(0.0, 100.0),
                );
            }
            // Taken after the refresh, so that "due" here implies due for
            // sysinfo, whose own clock started a moment earlier.
            self.cpu_read_at = Some(Instant::now());
        }
        put(LOAD1, System::load_average().one);
    }

    fn sample_memory(&mut self, put: &mut impl FnMut(&str, f64)) {
        self.system
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram().with_swap());
        let total = self.system.total_memory();
        // sysinfo leaves everything at 0 when /proc/meminfo cannot be read.
        if total > 0 {
            let used = self.system.used_memory();
            put(MEMORY_USED_BYTES, used as f64);
            put(MEMORY_PERCENT, percent(used, total));
            put(SWAP_USED_BYTES, self.system.used_swap() as f64);
        }
    }

    fn sample_disk_space(&self, put: &mut impl FnMut(&str, f64)) {
        let stats = match nix::sys::statvfs::statvfs(&self.disk_path) {
            Ok(stats) => stats,
            Err(e) => {
                tracing::debug!(path = %self.disk_path.display(), error = %e, "statvfs failed");
                return;
            }
        };
        let block = stats.fragment_size();
        let free_for_users = stats.blocks_available().saturating_mul(block);
        let used = stats
            .blocks()
            .saturating_sub(stats.blocks_free())
            .saturating_mul(block);
        // As df: the blocks reserved for root count as neither used nor free.
        let usable = used.saturating_add(free_for_users);
        if usable > 0 {
            put(DISK_USED_PERCENT, percent(used, usable));
        }
        put(DISK_FREE_BYTES, free_for_users as f64);
    }

    fn sample_traffic(&mut self, put: &mut impl FnMut(&str, f64)) {
        let physical = &mut self.physical_disks;
        let disks = read_proc("/proc/diskstats").map(|text| {
            parse_diskstats(&text, |name| {
                *physical
                    .entry(name.to_owned())
                    .or_insert_with(|| is_physical_disk(name))
            })
        });
        let nets = read_proc("/proc/net/dev").map(|text| parse_net_dev(&text));
        let now = Counters {
            at: Instant::now(),
            disks: disks.unwrap_or_default(),
            nets: nets.unwrap_or_default(),
        };
        if let Some(previous) = &self.previous {
            let seconds = now.at.duration_since(previous.at).as_secs_f64();
            if seconds > 0.0 {
                let rate = |bytes: u64| bytes as f64 / seconds;
                if !now.disks.is_empty() {
                    let (read, written) = traffic_since(&previous.disks, &now.disks);
                    put(DISK_READ_BYTES_PER_S, rate(read));
                    put(DISK_WRITE_BYTES_PER_S, rate(written));
                }
                if !now.nets.is_empty() {
                    let (received, sent) = traffic_since(&previous.nets, &now.nets);
                    put(NET_RX_BYTES_PER_S, rate(received));
                    put(NET_TX_BYTES_PER_S, rate(sent));
                }
            }
        }
        self.previous = Some(now);
    }
}

/// Byte counters at one instant: per disk (read, written), per interface
/// (received, sent).
#[derive(Debug)]
struct Counters {
    at: Instant,
    disks: HashMap<String, (u64, u64)>,
    nets: HashMap<String, (u64, u64)>,
}

/// Bytes moved between two readings, summed over the devices present in
/// both: one that appeared, vanished or reset its counters adds nothing.
fn traffic_since(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
) -> (u64, u64) {
    after
        .iter()
        .filter_map(|(name, &(a, b))| {
            let &(a0, b0) = before.get(name)?;
            Some((a.saturating_sub(a0), b.saturating_sub(b0)))
        })
        .fold((0, 0), |(a, b), (da, db)| {
            (a.saturating_add(da), b.saturating_add(db))
        })
}

/// Bytes (read, written) per device of `/proc/diskstats` that `keep` accepts.
fn parse_diskstats(text: &str, mut keep: impl FnMut(&str) -> bool) -> HashMap<String, (u64, u64)> {
    let mut disks = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // major minor name reads merged sectors_read ms writes merged sectors_written ...
        let (Some(&name), Some(read), Some(written)) = (
            fields.get(2),
            fields.get(5).and_then(|f| f.parse::<u64>().ok()),
            fields.get(9).and_then(|f| f.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if keep(name) {
            disks.insert(
                name.to_owned(),
                (
                    read.saturating_mul(SECTOR_BYTES),
                    written.saturating_mul(SECTOR_BYTES),
                ),
            );
        }
    }
    disks
}

/// Whole devices backed by hardware have a `device` link; partitions are
/// not in `/sys/block` at all, and loop, zram, dm and md devices have none.
fn is_physical_disk(name: &str) -> bool {
    // Names with a slash (cciss/c0d0) appear with a '!' in sysfs.
    Path::new("/sys/block")
        .join(name.replace('/', "!"))
        .join("device")
        .exists()
}

/// Bytes (received, sent) per interface of `/proc/net/dev`, but `lo`.
fn parse_net_dev(text: &str) -> HashMap<String, (u64, u64)> {
    let mut nets = HashMap::new();
    // Two header lines, then "  eth0: rx_bytes packets ... (8 rx fields) tx_bytes ...".
    for line in text.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name == "lo" {
            continue;
        }
        let mut fields = counters.split_whitespace();
        let received = fields.next().and_then(|f| f.parse::<u64>().ok());
        let sent = fields.nth(7).and_then(|f| f.parse::<u64>().ok());
        if let (Some(received), Some(sent)) = (received, sent) {
            nets.insert(name.to_owned(), (received, sent));
        }
    }
    nets
}

/// Processes (not threads) that this PID namespace can see.
fn process_count() -> Option<usize> {
    let entries = std::fs::read_dir("/proc")
        .inspect_err(|e| tracing::debug!(error = %e, "cannot list /proc"))
        .ok()?;
    let count = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.as_encoded_bytes();
            !name.is_empty() && name.iter().all(u8::is_ascii_digit)
        })
        .count();
    Some(count)
}

fn read_proc(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .inspect_err(|e| tracing::debug!(path, error = %e, "cannot read"))
        .ok()
}

fn percent(part: u64, whole: u64) -> f64 {
    (part as f64 / whole as f64 * 100.0).clamp(0.0, 100.0)
}

/// The node's NVIDIA GPUs through NVML, or why there are none.
struct Gpus {
    nvml: Option<Nvml>,
    count: u32,
    status: String,
}

impl fmt::Debug for Gpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpus")
            .field("count", &self.count)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Gpus {
    fn open(lib: &OsStr) -> Self {
        let none = |status: String| Self {
            nvml: None,
            count: 0,
            status,
        };
        let nvml = match Nvml::builder().lib_path(lib).init() {
            Ok(nvml) => nvml,
            // libloading's message names the library and what went wrong.
            Err(NvmlError::LibloadingError(e)) => return none(format!("no NVIDIA GPU ({e})")),
            Err(NvmlError::DriverNotLoaded) => {
                return none(format!(
                    "no NVIDIA GPU ({} loaded, but the NVIDIA driver is not running)",
                    lib.display()
                ));
            }
            Err(e) => return none(format!("no NVIDIA GPU (NVML failed to start: {e})")),
        };
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(e) => return none(format!("no NVIDIA GPU (NVML cannot count GPUs: {e})")),
        };
        let driver = nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "unknown".to_owned());
        let plural = if count == 1 { "" } else { "s" };
        Self {
            nvml: Some(nvml),
            count,
            status: format!("NVML: {count} GPU{plural} (driver {driver})"),
        }
    }

    fn sample(&self, out: &mut Vec<(String, f64)>) {
        let Some(nvml) = &self.nvml else {
            return;
        };
        for i in 0..self.count {
            let device = match nvml.device_by_index(i) {
                Ok(device) => device,
                Err(e) => {
                    tracing::debug!(gpu = i, error = %e, "NVML cannot open the GPU");
                    continue;
                }
            };
            let mut put = |name: &str, value: f64| out.push((format!("gpu/{i}/{name}"), value));
            if let Some(rates) = reading(i, "utilization", device.utilization_rates()) {
                put(
                    "utilization_percent",
                    f64::from(rates.gpu).clamp(0.0, 100.0),
                );
            }
            if let Some(memory) = reading(i, "memory", device.memory_info()) {
                put("memory_used_bytes", memory.used as f64);
                if memory.total > 0 {
                    put("memory_percent", percent(memory.used, memory.total));
                }
            }
            if let Some(celsius) =
                reading(i, "temperature", device.temperature(TemperatureSensor::Gpu))
            {
                put("temperature_c", f64::from(celsius));
            }
            if let Some(milliwatts) = reading(i, "power", device.power_usage()) {
                put("power_watts", f64::from(milliwatts) / 1000.0);
            }
        }
    }
}

/// One GPU value, or `None` when it cannot be had; only unexpected errors
/// are logged, since a GPU that does not support a value says so every time.
fn reading<T>(gpu: u32, what: &str, result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(gpu, what, error = %e, "NVML reading failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diskstats_counts_sectors_of_kept_devices_in_bytes() {
        let text = "\
   7       0 loop0 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       0 nvme0n1 100 5 2000 30 40 2 3000 50 0 60 80 0 0 0 0 0 0
 259       1 nvme0n1p1 90 5 1900 30 40 2 2900 50 0 60 80 0 0 0 0 0 0
 253       0 dm-0 1 0 8 0 1 0 8 0 0 0 0
 garbage line
";
        let disks = parse_diskstats(text, |name| name == "nvme0n1");
        assert_eq!(disks.len(), 1);
        assert_eq!(disks["nvme0n1"], (2000 * 512, 3000 * 512));
    }

    #[test]
    fn net_dev_skips_loopback_and_reads_rx_and_tx_bytes() {
        let text = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 9594945295 100 0 0 0 0 0 0 9594945295 100 0 0 0 0 0 0
  eth0:1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0
ib0: 5 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0
";
        let nets = parse_net_dev(text);
        assert_eq!(nets.len(), 2, "{nets:?}");
        assert_eq!(nets["eth0"], (1000, 2000));
        assert_eq!(nets["ib0"], (5, 7));
    }

    #[test]
    fn traffic_ignores_devices_that_appeared_vanished_or_reset() {
        let map = |entries: &[(&str, (u64, u64))]| -> HashMap<String, (u64, u64)> {
            entries.iter().map(|(n, c)| (n.to_string(), *c)).collect()
        };
        let before = map(&[
            ("eth0", (100, 200)),
            ("veth1", (50, 50)),
            ("eth1", (900, 900)),
        ]);
        let after = map(&[
            ("eth0", (150, 260)),
            ("veth2", (70, 70)),
            ("eth1", (10, 20)),
        ]);
        assert_eq!(traffic_since(&before, &after), (50, 60));
    }

    #[test]
    fn missing_nvml_library_means_no_gpu_keys_and_a_status_that_says_why() {
        let lib = "libnvidia-ml-absent-for-test.so.1";
        let mut sampler = SystemSampler::with_nvml_lib(Path::new("/"), OsStr::new(lib));
        let status = sampler.gpu_status();
        assert!(status.starts_with("no NVIDIA GPU ("), "{status}");
        assert!(status.contains(lib), "{status}");
        for _ in 0..2 {
            let keys: Vec<String> = sampler.sample().into_iter().map(|(k, _)| k).collect();
            assert!(keys.iter().all(|k| !k.starts_with("gpu/")), "{keys:?}");
            assert!(keys.iter().any(|k| k == MEMORY_USED_BYTES), "{keys:?}");
        }
    }

    #[test]
    fn a_sampler_can_move_to_the_launchers_metrics_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<SystemSampler>();
    }
}
