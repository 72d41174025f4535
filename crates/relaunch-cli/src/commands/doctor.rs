//! `relaunch doctor`: checks this host for what breaks distributed training.

use relaunch_launch::doctor::stops::{self, Stops};
use relaunch_launch::doctor::{self, Finding, Host, Level};

use crate::Context;
use crate::cli::{DoctorArgs, DoctorFormat};
use crate::output;

/// Runs every check and prints them; exit code 1 when one fails.
pub(crate) fn run(args: &DoctorArgs, context: &Context) -> anyhow::Result<u8> {
    let host = Host::probe();
    let mut findings = doctor::quick(&host, args.nnodes > 1);
    findings.push(doctor::check_gpus(&host));
    findings.push(doctor::check_port(&host, args.port));
    let python = context.python();
    findings.push(doctor::check_python(&python));
    let grace = args.grace_period.map(|d| d.as_secs_f64());
    findings.extend(stops::check(&Stops::probe(args.ckpt_dir.as_deref(), grace)));
    findings.sort_by_key(|f| std::cmp::Reverse(f.level));
    match args.format {
        DoctorFormat::Text => output::text(&render(&host.hostname, &findings)),
        DoctorFormat::Json => output::text(&json(&findings)),
    }
    Ok(u8::from(findings.iter().any(|f| f.level == Level::Fail)))
}

fn render(hostname: &str, findings: &[Finding]) -> String {
    let mut s = format!("relaunch doctor: {hostname}\n");
    for f in findings {
        s.push_str(&format!(
            "  {:<5} {:<19} {}\n",
            f.level.label(),
            f.check,
            f.found
        ));
        if let Some(fix) = &f.fix {
            s.push_str(&format!("  {:<5} {:<19} fix: {fix}\n", "", ""));
        }
    }
    let worst = findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
    s.push_str(match worst {
        Level::Fail => "some checks failed: jobs on this host will break until they are fixed\n",
        Level::Warn => "no failures; the warnings can break or slow some jobs\n",
        _ => "all good\n",
    });
    s
}

fn json(findings: &[Finding]) -> String {
    let list: Vec<serde_json::Value> = findings
        .iter()
        .map(|f| {
            serde_json::json!({
                "check": f.check,
                "level": f.level.label().to_ascii_lowercase(),
                "found": f.found,
                "fix": f.fix,
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap_or_default()
}
