//! Preflight checks for the host pitfalls that break distributed training:
//! `relaunch doctor` runs all of them; `relaunch run` runs the quick ones
//! and prints a line for each problem.
//!
//! Each check is a pure function of a [`Host`] snapshot, so tests can feed
//! it any situation; [`Host::probe`] reads the real one.

use std::collections::BTreeMap;
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use nix::sys::resource::{Resource, getrlimit};

pub mod stops;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    /// Worth knowing; not a problem here.
    Info,
    /// Likely to break or slow some jobs.
    Warn,
    /// Will break jobs.
    Fail,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One result: what was checked, what was found, and what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub found: String,
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: &'static str, level: Level, found: impl Into<String>) -> Self {
        Self {
            check,
            level,
            found: found.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// What the checks look at.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// Soft and hard RLIMIT_MEMLOCK, `None` for unlimited.
    pub memlock: (Option<u64>, Option<u64>),
    /// Soft and hard RLIMIT_NOFILE.
    pub nofile: (Option<u64>, Option<u64>),
    /// Size of `/dev/shm`, if mounted.
    pub shm_bytes: Option<u64>,
    /// InfiniBand/RoCE devices (`/sys/class/infiniband`).
    pub rdma_devices: Vec<String>,
    /// NVIDIA device files (`/dev/nvidia0`, ...).
    pub gpu_devices: usize,
    /// The NVIDIA kernel driver's version line, if loaded.
    pub driver: Option<String>,
    /// Network interfaces (`/sys/class/net`).
    pub interfaces: Vec<String>,
    pub hostname: String,
    /// What the hostname resolves to.
    pub hostname_addrs: Vec<IpAddr>,
    /// The environment variables the checks read.
    pub env: BTreeMap<String, String>,
}

/// Variables the checks read, or whose prefix they read.
const ENV_PREFIXES: &[&str] = &["NCCL_", "GLOO_", "TP_SOCKET_IFNAME"];
const ENV_NAMES: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
];

impl Host {
    /// Reads this machine.
    pub fn probe() -> Self {
        let limit = |resource| match getrlimit(resource) {
            Ok((soft, hard)) => (finite(soft), finite(hard)),
            Err(_) => (None, None),
        };
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        let hostname_addrs = (hostname.as_str(), 0)
            .to_socket_addrs()
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default();
        Self {
            memlock: limit(Resource::RLIMIT_MEMLOCK),
            nofile: limit(Resource::RLIMIT_NOFILE),
            shm_bytes: nix::sys::statvfs::statvfs("/dev/shm")
                .ok()
                .map(|s| s.blocks().saturating_mul(s.fragment_size())),
            rdma_devices: dir_names("/sys/class/infiniband"),
            gpu_devices: crate::config::visible_gpus_from_devices(),
            driver: std::fs::read_to_string("/proc/driver/nvidia/version")
                .ok()
                .and_then(|v| v.lines().next().map(str::to_owned)),
            interfaces: dir_names("/sys/class/net"),
            hostname,
            hostname_addrs,
            env: std::env::vars()
                .filter(|(k, _)| {
                    ENV_NAMES.contains(&k.as_str()) || ENV_PREFIXES.iter().any(|p| k.starts_with(p))
                })
                .collect(),
        }
    }
}

fn finite(limit: u64) -> Option<u64> {
    (limit != nix::libc::RLIM_INFINITY).then_some(limit)
}

fn dir_names(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes / MIB)
    }
}

/// RDMA (InfiniBand, RoCE) registers memory: NCCL needs an unlimited
/// locked-memory limit there.
pub fn check_memlock(host: &Host) -> Finding {
    let (soft, _) = host.memlock;
    match (soft, host.rdma_devices.is_empty()) {
        (None, _) => Finding::new("locked memory", Level::Ok, "unlimited (ulimit -l)"),
        (Some(limit), true) => Finding::new(
            "locked memory",
            Level::Info,
            format!("limited to {} (ulimit -l); no RDMA device here, so NCCL does not need more", size(limit)),
        ),
        (Some(limit), false) => Finding::new(
            "locked memory",
            Level::Warn,
            format!(
                "limited to {} with RDMA devices {}: NCCL over InfiniBand/RoCE fails to register memory or falls back to TCP",
                size(limit),
                host.rdma_devices.join(", ")
            ),
        )
        .fix("raise it to unlimited: `ulimit -l unlimited`, `memlock unlimited` in /etc/security/limits.conf, or --ulimit memlock=-1 for containers"),
    }
}

/// DataLoader workers pass batches through `/dev/shm`; containers default
/// to 64 MiB, which ends in "bus error" crashes.
pub fn check_shm(host: &Host) -> Finding {
    const SMALL: u64 = 1 << 30;
    match host.shm_bytes {
        None => Finding::new("/dev/shm", Level::Warn, "not mounted: DataLoader workers cannot share batches")
            .fix("mount a tmpfs there, or run the container with --shm-size=16g (Kubernetes: an emptyDir with medium: Memory)"),
        Some(bytes) if bytes < SMALL => Finding::new(
            "/dev/shm",
            Level::Warn,
            format!("only {}: DataLoader workers crash with \"bus error\" once batches outgrow it", size(bytes)),
        )
        .fix("give it at least a few GiB: docker run --shm-size=16g, or an emptyDir with medium: Memory on Kubernetes"),
        Some(bytes) => Finding::new("/dev/shm", Level::Ok, size(bytes)),
    }
}

/// Every rank opens sockets and files; the store holds one connection per
/// rank.
pub fn check_nofile(host: &Host) -> Finding {
    const LOW: u64 = 4096;
    match host.nofile {
        (Some(soft), hard) if soft < LOW => Finding::new(
            "open files",
            Level::Warn,
            format!(
                "soft limit {soft} (hard {}): large jobs run out of descriptors (\"Too many open files\")",
                hard.map_or("unlimited".into(), |h| h.to_string())
            ),
        )
        .fix("raise it: `ulimit -n 65536`, or nofile in /etc/security/limits.conf (relaunch raises its own soft limit to the hard one, and workers inherit that)"),
        (soft, hard) => Finding::new(
            "open files",
            Level::Ok,
            format!(
                "soft limit {} (hard {})",
                soft.map_or("unlimited".into(), |s| s.to_string()),
                hard.map_or("unlimited".into(), |h| h.to_string())
            ),
        ),
    }
}

/// GPUs the workers would see, and the driver behind them.
pub fn check_gpus(host: &Host) -> Finding {
    let visible = host.env.get("CUDA_VISIBLE_DEVICES");
    match (host.gpu_devices, &host.driver, visible) {
        (0, _, _) => Finding::new("GPUs", Level::Info, "none visible: NCCL cannot run here; use the gloo backend (CPU)"),
        (n, None, _) => Finding::new(
            "GPUs",
            Level::Fail,
            format!("{n} NVIDIA device file(s), but the NVIDIA kernel driver is not loaded (/proc/driver/nvidia/version is missing)"),
        )
        .fix("load the driver (nvidia-smi should work), or in a container use the NVIDIA container toolkit (--gpus all)"),
        (_, Some(_), Some(v)) if v.trim().is_empty() => Finding::new(
            "GPUs",
            Level::Warn,
            "CUDA_VISIBLE_DEVICES is set but empty: workers see no GPU",
        )
        .fix("unset CUDA_VISIBLE_DEVICES, or list the GPUs to use"),
        (n, Some(driver), visible) => Finding::new(
            "GPUs",
            Level::Ok,
            format!(
                "{n} device(s){}; driver: {driver}",
                visible.map_or(String::new(), |v| format!(", CUDA_VISIBLE_DEVICES={v}"))
            ),
        ),
    }
}

/// NCCL and Gloo settings that name network interfaces must name ones this
/// host has; a typo makes the first collective hang or fail.
pub fn check_network_env(host: &Host) -> Vec<Finding> {
    let mut findings = Vec::new();
    for var in [
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TP_SOCKET_IFNAME",
    ] {
        let Some(value) = host.env.get(var) else {
            continue;
        };
        let missing: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .filter(|name| {
                // NCCL's syntax: `^eth` excludes, `=eth0` is exact, else a prefix.
                let (exclude, exact, base) = match name.strip_prefix('^') {
                    Some(rest) => (true, false, rest),
                    None => match name.strip_prefix('=') {
                        Some(rest) => (false, true, rest),
                        None => (false, false, *name),
                    },
                };
                !exclude
                    && !host.interfaces.iter().any(|i| {
                        if exact {
                            i == base
                        } else {
                            i.starts_with(base)
                        }
                    })
            })
            .collect();
        findings.push(if missing.is_empty() {
            Finding::new("network interfaces", Level::Ok, format!("{var}={value}"))
        } else {
            Finding::new(
                "network interfaces",
                Level::Fail,
                format!(
                    "{var}={value} names {} but this host has {}",
                    missing.join(", "),
                    host.interfaces.join(", ")
                ),
            )
            .fix(format!(
                "set {var} to one of the interfaces above (the one other nodes reach this host on)"
            ))
        });
    }
    let nccl: Vec<String> = host
        .env
        .iter()
        .filter(|(k, _)| k.starts_with("NCCL_") && *k != "NCCL_SOCKET_IFNAME")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !nccl.is_empty() {
        let disabled = host.env.get("NCCL_IB_DISABLE").is_some_and(|v| v == "1");
        findings.push(Finding::new(
            "NCCL settings",
            if disabled && !host.rdma_devices.is_empty() {
                Level::Warn
            } else {
                Level::Info
            },
            nccl.join(" "),
        ));
    }
    findings
}

/// Proxy variables decide how the tracking client reaches its server; an
/// internal server host missing from `no_proxy` sends traffic to the proxy.
pub fn check_proxies(host: &Host) -> Finding {
    let get = |a: &str, b: &str| host.env.get(a).or_else(|| host.env.get(b)).cloned();
    let (http, https, no) = (
        get("http_proxy", "HTTP_PROXY"),
        get("https_proxy", "HTTPS_PROXY"),
        get("no_proxy", "NO_PROXY"),
    );
    if http.is_none() && https.is_none() {
        return Finding::new("proxies", Level::Ok, "none set");
    }
    let mut found = Vec::new();
    if let Some(p) = &http {
        found.push(format!("http_proxy={p}"));
    }
    if let Some(p) = &https {
        found.push(format!("https_proxy={p}"));
    }
    match no {
        Some(no)
            if no
                .split(',')
                .any(|h| matches!(h.trim(), "localhost" | "127.0.0.1")) =>
        {
            found.push(format!("no_proxy={no}"));
            Finding::new("proxies", Level::Info, found.join(" "))
        }
        other => {
            found.push(format!("no_proxy={}", other.unwrap_or_default()));
            Finding::new(
                "proxies",
                Level::Warn,
                format!(
                    "{}: local traffic would go through the proxy",
                    found.join(" ")
                ),
            )
            .fix("add localhost,127.0.0.1 and the tracking server's host to no_proxy")
        }
    }
}

/// Other nodes (and Gloo) reach this one by its hostname; a hostname that
/// resolves to a loopback address (Debian's `127.0.1.1`) breaks multi-node
/// jobs.
pub fn check_hostname(host: &Host, multi_node: bool) -> Finding {
    let addrs: Vec<String> = host.hostname_addrs.iter().map(IpAddr::to_string).collect();
    if host.hostname_addrs.is_empty() {
        return Finding::new(
            "hostname",
            Level::Warn,
            format!("{:?} does not resolve", host.hostname),
        )
        .fix("add it to /etc/hosts or DNS with this node's network address");
    }
    if host.hostname_addrs.iter().all(IpAddr::is_loopback) {
        let finding = Finding::new(
            "hostname",
            if multi_node { Level::Warn } else { Level::Info },
            format!(
                "{:?} resolves to {} (loopback): fine on one node; other nodes cannot reach this one by name",
                host.hostname,
                addrs.join(", ")
            ),
        );
        return finding.fix(
            "for multi-node jobs, map the hostname to the node's network address in /etc/hosts or DNS, \
             or set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the interface the nodes share",
        );
    }
    Finding::new(
        "hostname",
        Level::Ok,
        format!("{:?} resolves to {}", host.hostname, addrs.join(", ")),
    )
}

/// Whether `port` is free here, and reachable through the hostname.
pub fn check_port(host: &Host, port: u16) -> Finding {
    let listener = match TcpListener::bind(("0.0.0.0", port)) {
        Ok(listener) => listener,
        Err(e) => {
            return Finding::new("rendezvous port", Level::Fail, format!("port {port} cannot be bound: {e}"))
                .fix(format!(
                    "free it (`ss -ltnp 'sport = :{port}'` shows who holds it), or choose another --master-port / --rdzv-endpoint port"
                ));
        }
    };
    let Some(addr) = host.hostname_addrs.first() else {
        return Finding::new("rendezvous port", Level::Ok, format!("port {port} is free"));
    };
    let reached = TcpStream::connect_timeout(&(*addr, port).into(), Duration::from_secs(2));
    drop(listener);
    match reached {
        Ok(_) => Finding::new(
            "rendezvous port",
            Level::Ok,
            format!(
                "port {port} is free and reachable at {}:{port}",
                host.hostname
            ),
        ),
        Err(e) => Finding::new(
            "rendezvous port",
            Level::Warn,
            format!(
                "port {port} is free but {}:{port} ({addr}) is not reachable: {e}",
                host.hostname
            ),
        )
        .fix("check the firewall (the port must be open between nodes)"),
    }
}

/// Whether the workers' Python imports torch, and which build it is.
pub fn check_python(python: &std::ffi::OsStr) -> Finding {
    const PROBE: &str = "import json, torch, torch.distributed as d\n\
        print(json.dumps({'torch': torch.__version__, 'cuda': torch.cuda.is_available(), \
        'nccl': d.is_nccl_available(), 'gloo': d.is_gloo_available()}))";
    let out = std::process::Command::new(python)
        .args(["-c", PROBE])
        .output();
    let shown = Path::new(python).display();
    match out {
        Err(e) => Finding::new("python", Level::Fail, format!("cannot run {shown}: {e}")).fix(
            "install Python 3 or point PYTHON_EXEC at the interpreter of your training environment",
        ),
        Ok(out) if !out.status.success() => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").to_owned();
            Finding::new("python", Level::Fail, format!("{shown} cannot import torch: {last}"))
                .fix("pip install torch in that environment, or set PYTHON_EXEC to the interpreter that has it")
        }
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let json: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_default();
            Finding::new(
                "python",
                Level::Ok,
                format!(
                    "{shown}: torch {}, CUDA {}, NCCL {}, Gloo {}",
                    json["torch"].as_str().unwrap_or("?"),
                    yes_no(&json["cuda"]),
                    yes_no(&json["nccl"]),
                    yes_no(&json["gloo"])
                ),
            )
        }
    }
}

fn yes_no(v: &serde_json::Value) -> &'static str {
    if v.as_bool().unwrap_or(false) {
        "yes"
    } else {
        "no"
    }
}

/// The checks that cost nothing, for `relaunch run` to warn about at start.
pub fn quick(host: &Host, multi_node: bool) -> Vec<Finding> {
    let mut findings = vec![
        check_memlock(host),
        check_shm(host),
        check_nofile(host),
        check_hostname(host, multi_node),
        check_proxies(host),
    ];
    findings.extend(check_network_env(host));
    findings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            memlock: (Some(8 << 20), Some(8 << 20)),
            nofile: (Some(65536), Some(65536)),
            shm_bytes: Some(16 << 30),
            interfaces: vec!["lo".into(), "eth0".into(), "ib0".into()],
            hostname: "node3".into(),
            hostname_addrs: vec!["10.0.0.3".parse().unwrap()],
            ..Host::default()
        }
    }

    #[test]
    fn memlock_matters_only_with_rdma() {
        let mut h = host();
        assert_eq!(check_memlock(&h).level, Level::Info);
        h.rdma_devices = vec!["mlx5_0".into()];
        let f = check_memlock(&h);
        assert_eq!(f.level, Level::Warn);
        assert!(f.fix.unwrap().contains("unlimited"));
        h.memlock = (None, None);
        assert_eq!(check_memlock(&h).level, Level::Ok);
    }

    #[test]
    fn a_container_sized_shm_is_a_warning() {
        let mut h = host();
        assert_eq!(check_shm(&h).level, Level::Ok);
        h.shm_bytes = Some(64 << 20);
        let f = check_shm(&h);
        assert_eq!(f.level, Level::Warn);
        assert!(f.found.contains("64 MiB") && f.found.contains("bus error"));
        assert!(f.fix.unwrap().contains("--shm-size"));
    }

    #[test]
    fn low_open_file_limits_are_a_warning() {
        let mut h = host();
        assert_eq!(check_nofile(&h).level, Level::Ok);
        h.nofile = (Some(1024), Some(4096));
        assert_eq!(check_nofile(&h).level, Level::Warn);
    }

    #[test]
    fn interface_names_must_exist() {
        let mut h = host();
        h.env.insert("NCCL_SOCKET_IFNAME".into(), "eth".into());
        assert_eq!(check_network_env(&h)[0].level, Level::Ok);
        h.env.insert("NCCL_SOCKET_IFNAME".into(), "=eth1".into());
        let f = &check_network_env(&h)[0];
        assert_eq!(f.level, Level::Fail);
        assert!(
            f.found
                .contains("names =eth1 but this host has lo, eth0, ib0"),
            "{}",
            f.found
        );
        h.env
            .insert("NCCL_SOCKET_IFNAME".into(), "^docker,lo".into());
        assert_eq!(check_network_env(&h)[0].level, Level::Ok);
        h.env.insert("GLOO_SOCKET_IFNAME".into(), "wlan0".into());
        assert!(
            check_network_env(&h)
                .iter()
                .any(|f| f.level == Level::Fail && f.found.contains("GLOO"))
        );
    }

    #[test]
    fn proxies_without_local_exceptions_are_a_warning() {
        let mut h = host();
        assert_eq!(check_proxies(&h).level, Level::Ok);
        h.env
            .insert("https_proxy".into(), "http://proxy:3128".into());
        assert_eq!(check_proxies(&h).level, Level::Warn);
        h.env
            .insert("no_proxy".into(), "localhost,10.0.0.0/8".into());
        assert_eq!(check_proxies(&h).level, Level::Info);
    }

    #[test]
    fn a_loopback_hostname_warns_for_multi_node_jobs() {
        let mut h = host();
        assert_eq!(check_hostname(&h, true).level, Level::Ok);
        h.hostname_addrs = vec!["127.0.1.1".parse().unwrap()];
        assert_eq!(check_hostname(&h, false).level, Level::Info);
        assert_eq!(check_hostname(&h, true).level, Level::Warn);
        h.hostname_addrs.clear();
        assert_eq!(check_hostname(&h, false).level, Level::Warn);
    }

    #[test]
    fn gpus_without_a_driver_fail() {
        let mut h = host();
        assert_eq!(check_gpus(&h).level, Level::Info);
        h.gpu_devices = 8;
        assert_eq!(check_gpus(&h).level, Level::Fail);
        h.driver = Some("NVRM version: NVIDIA UNIX x86_64 Kernel Module 570.0".into());
        assert_eq!(check_gpus(&h).level, Level::Ok);
        h.env.insert("CUDA_VISIBLE_DEVICES".into(), "".into());
        assert_eq!(check_gpus(&h).level, Level::Warn);
    }

    #[test]
    fn a_taken_port_fails() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let f = check_port(&host(), port);
        assert_eq!(f.level, Level::Fail);
        assert!(f.fix.unwrap().contains("ss -ltnp"));
    }
}
