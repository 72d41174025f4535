//! Kubernetes: the launch as an Indexed Job's pod describes it.
//!
//! In a pod of an Indexed Job (`completionMode: Indexed`, which sets
//! `JOB_COMPLETION_INDEX`) whose pods name a headless Service as their
//! `subdomain`, every pod is `JOB-INDEX` and reaches the others as
//! `JOB-INDEX.SERVICE`; `relaunch run` reads:
//!
//! | setting | from |
//! |---|---|
//! | `--node-rank` | `JOB_COMPLETION_INDEX` |
//! | `--master-addr` | `JOB-0.SERVICE`: this pod's hostname (`HOSTNAME`) with the index replaced by 0, and the Service from the pod's full name in `/etc/hosts` (the kubelet writes `IP JOB-I.SERVICE.NAMESPACE.svc.DOMAIN JOB-I` there) |
//! | `--master-port` | 29500, as torchrun (every pod has its own addresses) |
//! | `--run-id` | `k8s-JOB` (a pod restarted by the Job keeps it) |
//!
//! `--nnodes` and `--nproc-per-node` are not in a pod's environment: the
//! Job's command gives them (`examples/kubernetes/`).

use super::scheduler::{Allocation, Sourced};

/// torchrun's default store port.
pub(crate) const PORT: u16 = 29500;

/// The allocation, or `None` outside an Indexed Job. `etc_hosts` reads
/// `/etc/hosts` (a parameter for tests).
pub(crate) fn allocation(
    env: &dyn Fn(&str) -> Option<String>,
    etc_hosts: &dyn Fn() -> Option<String>,
) -> Result<Option<Allocation>, String> {
    let Some(index_text) = env("JOB_COMPLETION_INDEX") else {
        return Ok(None);
    };
    let index: usize = index_text.trim().parse().map_err(|_| {
        format!("JOB_COMPLETION_INDEX={index_text:?} is not a completion index (a number)")
    })?;
    let hostname = env("HOSTNAME").ok_or_else(|| {
        "JOB_COMPLETION_INDEX is set but HOSTNAME is not: in an Indexed Job the pod's hostname \
         is JOB-INDEX; give --master-addr and --run-id"
            .to_owned()
    })?;
    let suffix = format!("-{index}");
    let job = hostname.strip_suffix(&suffix).ok_or_else(|| {
        format!(
            "HOSTNAME={hostname:?} does not end in -{index} (JOB_COMPLETION_INDEX): the pod is \
             not named as an Indexed Job's pods are; give --master-addr and --run-id"
        )
    })?;
    let service = etc_hosts().and_then(|hosts| service_of(&hosts, &hostname));
    let master_addr = service.map(|service| {
        Sourced::scheduler(
            format!("{job}-0.{service}"),
            "HOSTNAME",
            format!("index 0 of Job {job}, through Service {service} (/etc/hosts)"),
        )
    });
    Ok(Some(Allocation {
        scheduler: "Kubernetes",
        run_id: Sourced::scheduler(format!("k8s-{job}"), "HOSTNAME", format!("Job {job}")),
        nnodes: None,
        node_rank: Some(Sourced::scheduler(index, "JOB_COMPLETION_INDEX", "")),
        master_addr,
        master_port: Some(Sourced::default(
            PORT,
            "torchrun's, in the pod's own network",
        )),
        nproc_per_node: None,
        stop_signals: None,
        requeue: None,
    }))
}

/// The Service in this pod's full name (`HOST.SERVICE.NAMESPACE.svc...`)
/// from `/etc/hosts`, where the kubelet writes it when the pod has a
/// `subdomain`.
fn service_of(hosts: &str, hostname: &str) -> Option<String> {
    let prefix = format!("{hostname}.");
    hosts
        .lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .flat_map(|line| line.split_whitespace().skip(1))
        .find_map(|name| {
            let rest = name.strip_prefix(&prefix)?;
            let service = rest.split('.').next()?;
            (!service.is_empty() && rest.contains(".svc")).then(|| service.to_owned())
        })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const HOSTS: &str = "\
# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
10.244.1.7\ttrain-2.trainers.ml.svc.cluster.local\ttrain-2
";

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn an_indexed_jobs_pod_gives_its_rank_the_first_pods_address_and_the_run() {
        let vars = env(&[("JOB_COMPLETION_INDEX", "2"), ("HOSTNAME", "train-2")]);
        let a = allocation(&vars, &|| Some(HOSTS.to_owned()))
            .unwrap()
            .unwrap();
        assert_eq!(a.scheduler, "Kubernetes");
        assert_eq!(a.node_rank.unwrap().value, 2);
        assert_eq!(a.master_addr.unwrap().value, "train-0.trainers");
        assert_eq!(a.run_id.value, "k8s-train");
        assert_eq!(a.master_port.unwrap().value, 29500);
        assert!(a.nnodes.is_none() && a.nproc_per_node.is_none() && a.requeue.is_none());
    }

    #[test]
    fn without_a_subdomain_the_master_is_left_to_the_flags_and_bad_values_are_said() {
        let vars = env(&[("JOB_COMPLETION_INDEX", "0"), ("HOSTNAME", "train-0")]);
        let plain = "127.0.0.1 localhost\n10.0.0.3 train-0\n";
        let a = allocation(&vars, &|| Some(plain.to_owned()))
            .unwrap()
            .unwrap();
        assert!(a.master_addr.is_none());
        assert!(allocation(&env(&[]), &|| None).unwrap().is_none());
        for (vars, says) in [
            (
                vec![("JOB_COMPLETION_INDEX", "two"), ("HOSTNAME", "t-2")],
                "not a completion index",
            ),
            (vec![("JOB_COMPLETION_INDEX", "2")], "HOSTNAME is not"),
            (
                vec![("JOB_COMPLETION_INDEX", "2"), ("HOSTNAME", "web-7")],
                "does not end in -2",
            ),
        ] {
            let err = allocation(&env(&vars), &|| None).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
