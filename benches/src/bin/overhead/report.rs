//! The result: one table, the targets icecore is held to, the machine it
//! ran on, and where icecore's own time went.

use std::fmt::Write;

use crate::self_profile::SelfProfile;

/// One measured configuration: no profiler, icecore or perf at a rate.
#[derive(Debug, Default)]
pub struct Row {
    pub profiler: &'static str,
    pub frequency_hz: Option<u32>,
    /// The collector's CPU time in the window, as a fraction of one core.
    pub cpu_share: Option<f64>,
    /// User-space CPU time per sample until a symbolized stack exists.
    pub us_per_sample: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub bpf_ns_per_sample: Option<f64>,
    /// Native and interpreter frames walked per sample.
    pub frames_per_sample: Option<f64>,
    pub bpf_map_bytes: Option<u64>,
    pub samples: Option<u64>,
    pub expected_samples: Option<u64>,
    /// Units per second of each workload, in the order of `Report::workloads`.
    pub throughput: Vec<Option<f64>>,
    /// The rates to compare `throughput` with: the mean of the windows
    /// without a profiler just before and just after this one.
    pub reference: Vec<Option<f64>>,
    /// Anything the columns do not say.
    pub notes: Vec<String>,
}

/// Where the benchmark ran.
#[derive(Debug, Default)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    pub icecore: String,
    pub perf: Option<String>,
    pub python: Option<String>,
    pub date_utc: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown".into(), |(_, v)| v.trim().to_owned());
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let os = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map_or("unknown".into(), |v| v.trim_matches('"').to_owned());
        Machine {
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            memory_gib: memory_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            os,
            date_utc: utc_now(),
            ..Machine::default()
        }
    }
}

/// "YYYY-MM-DD HH:MM UTC", from `date` (no date crate for one line).
fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(
            || "unknown date".to_owned(),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
}

pub struct Report {
    pub machine: Machine,
    pub window_seconds: u64,
    pub workloads: Vec<&'static str>,
    /// The runs without a profiler (before and after the others).
    pub baselines: Vec<Row>,
    pub rows: Vec<Row>,
    /// icecore's own profile, by rate.
    pub self_profiles: Vec<(u32, SelfProfile)>,
}

/// icecore's targets at 19 Hz (issue 6).
const TARGET_CPU_SHARE: f64 = 0.001;
const TARGET_US_PER_SAMPLE: f64 = 5.0;
const TARGET_BPF_FIXED_NS: f64 = 3000.0;
const TARGET_BPF_PER_FRAME_NS: f64 = 100.0;
const TARGET_RSS_BYTES: f64 = 50e6;
const TARGET_MAP_BYTES: f64 = 32.0 * 1024.0 * 1024.0;

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or("–".into(), f)
}

impl Report {
    fn throughput_cell(row: &Row, workload: usize) -> String {
        let rate = row.throughput.get(workload).copied().flatten();
        match (rate, row.reference.get(workload).copied().flatten()) {
            (Some(r), Some(b)) if b > 0.0 => format!("{:+.1} %", (r / b - 1.0) * 100.0),
            _ => "–".into(),
        }
    }

    /// How much a workload's rate varied without any profiler: the spread
    /// of the baseline windows around their mean, in percent.
    fn baseline_spread(&self, workload: usize) -> Option<(f64, f64)> {
        let rates: Vec<f64> = self
            .baselines
            .iter()
            .filter_map(|b| b.throughput.get(workload).copied().flatten())
            .collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        (rates.len() > 1 && mean > 0.0)
            .then(|| ((min / mean - 1.0) * 100.0, (max / mean - 1.0) * 100.0))
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(out, "# icecore overhead benchmark\n");
        let _ = writeln!(
            out,
            "Produced by `scripts/overhead-benchmark.sh` on {}. Both CPUs run a busy native \
             program built without frame pointers and a busy Python script; each profiler \
             profiles the whole host, one at a time, and every figure comes from a {} s \
             window of the same run.\n",
            m.date_utc, self.window_seconds
        );
        let _ = writeln!(out, "## Machine\n");
        let _ = writeln!(out, "- CPU: {} ({} CPUs)", m.cpu_model, m.cpus);
        let _ = writeln!(out, "- Memory: {:.1} GiB", m.memory_gib);
        let _ = writeln!(out, "- Kernel: {} ({})", m.kernel, m.os);
        let _ = writeln!(out, "- icecore: {}", m.icecore);
        let _ = writeln!(out, "- perf: {}", m.perf.as_deref().unwrap_or("not run"));
        let _ = writeln!(
            out,
            "- Python: {}\n",
            m.python.as_deref().unwrap_or("unknown")
        );
        let _ = writeln!(out, "## Results\n");
        let mut header = String::from(
            "| profiler | rate | CPU (% of one core) | user µs/sample | peak RSS | BPF ns/sample | frames/sample | BPF maps | samples/expected |",
        );
        let mut rule = String::from("|---|---|---|---|---|---|---|---|---|");
        for w in &self.workloads {
            let _ = write!(header, " {w} throughput |");
            rule.push_str("---|");
        }
        let _ = writeln!(out, "{header}\n{rule}");
        for row in self.baselines.iter().chain(&self.rows) {
            let _ = write!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.profiler,
                opt(row.frequency_hz, |h| format!("{h} Hz")),
                opt(row.cpu_share, |c| format!("{:.3} %", c * 100.0)),
                opt(row.us_per_sample, |u| format!("{u:.1}")),
                opt(row.peak_rss_bytes, |b| format!("{:.1} MB", b as f64 / 1e6)),
                opt(row.bpf_ns_per_sample, |n| format!("{n:.0}")),
                opt(row.frames_per_sample, |f| format!("{f:.1}")),
                opt(row.bpf_map_bytes, |b| format!(
                    "{:.1} MiB",
                    b as f64 / (1024.0 * 1024.0)
                )),
                match (row.samples, row.expected_samples) {
                    (Some(s), Some(e)) if e > 0 =>
                        format!("{s} / {e} ({:.1} %)", s as f64 * 100.0 / e as f64),
                    _ => "–".into(),
                },
            );
            for (i, _) in self.workloads.iter().enumerate() {
                let cell = if row.profiler == "none" {
                    opt(row.throughput.get(i).copied().flatten(), |r| {
                        format!("{r:.0}/s")
                    })
                } else {
                    Self::throughput_cell(row, i)
                };
                let _ = write!(out, " {cell} |");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "\n{COLUMNS}\n");
        for (i, w) in self.workloads.iter().enumerate() {
            if let Some((low, high)) = self.baseline_spread(i) {
                let _ = writeln!(
                    out,
                    "Without a profiler, the {w} workload's rate ranged from {low:+.1} % to \
                     {high:+.1} % of its mean over the {} windows: differences smaller than \
                     that are noise.\n",
                    self.baselines.len()
                );
            }
        }
        let notes: Vec<_> = self
            .baselines
            .iter()
            .chain(&self.rows)
            .flat_map(|r| {
                r.notes.iter().map(move |n| {
                    format!(
                        "- {} {}: {n}",
                        r.profiler,
                        opt(r.frequency_hz, |h| format!("at {h} Hz"))
                    )
                })
            })
            .collect();
        if !notes.is_empty() {
            let _ = writeln!(out, "Notes:\n\n{}\n", notes.join("\n"));
        }
        self.targets(&mut out);
        self.self_profile(&mut out);
        out
    }

    fn targets(&self, out: &mut String) {
        let Some(row) = self
            .rows
            .iter()
            .find(|r| r.profiler == "icecore" && r.frequency_hz == Some(19))
        else {
            return;
        };
        let _ = writeln!(out, "## Targets (icecore at 19 Hz)\n");
        let _ = writeln!(out, "| measure | target | measured | |\n|---|---|---|---|");
        let mut line =
            |what: &str, target: String, value: Option<f64>, limit: f64, shown: String| {
                let verdict = match value {
                    Some(v) if v <= limit => "met",
                    Some(_) => "**missed**",
                    None => "not measured",
                };
                let _ = writeln!(out, "| {what} | {target} | {shown} | {verdict} |");
            };
        line(
            "icecore CPU",
            "≤ 0.1 % of one core".into(),
            row.cpu_share,
            TARGET_CPU_SHARE,
            opt(row.cpu_share, |c| format!("{:.3} %", c * 100.0)),
        );
        line(
            "user-space CPU per sample",
            format!("≤ {TARGET_US_PER_SAMPLE} µs"),
            row.us_per_sample,
            TARGET_US_PER_SAMPLE,
            opt(row.us_per_sample, |u| format!("{u:.2} µs")),
        );
        let frames = row.frames_per_sample.unwrap_or(0.0);
        let bpf_budget = TARGET_BPF_FIXED_NS + TARGET_BPF_PER_FRAME_NS * frames;
        line(
            "BPF time per sample",
            format!("≤ 3 µs + 100 ns × {frames:.1} frames = {bpf_budget:.0} ns"),
            row.bpf_ns_per_sample,
            bpf_budget,
            opt(row.bpf_ns_per_sample, |n| format!("{n:.0} ns")),
        );
        line(
            "peak RSS",
            "≤ 50 MB".into(),
            row.peak_rss_bytes.map(|b| b as f64),
            TARGET_RSS_BYTES,
            opt(row.peak_rss_bytes, |b| format!("{:.1} MB", b as f64 / 1e6)),
        );
        line(
            "BPF map memory",
            "≤ 32 MiB".into(),
            row.bpf_map_bytes.map(|b| b as f64),
            TARGET_MAP_BYTES,
            opt(row.bpf_map_bytes, |b| {
                format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
            }),
        );
        out.push('\n');
    }

    fn self_profile(&self, out: &mut String) {
        for (hz, profile) in &self.self_profiles {
            if profile.samples == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "## Where icecore's own time went ({hz} Hz run, {} of its samples)\n",
                profile.samples
            );
            let _ = writeln!(out, "| function (self) | samples | share |\n|---|---|---|");
            for (name, n) in profile.leaves.iter().take(15) {
                let _ = writeln!(
                    out,
                    "| `{name}` | {n} | {:.1} % |",
                    *n as f64 * 100.0 / profile.samples as f64
                );
            }
            out.push('\n');
        }
    }
}

const COLUMNS: &str = "Columns: *CPU* is the collecting process's CPU time in the window \
(icecore, or `perf record`) over the window's length. *user µs/sample* is the user-space \
CPU time spent per sample until a symbolized stack exists: icecore's CPU in the window over \
the samples it received; for perf, `perf record`'s and `perf script`'s CPU over the samples \
`perf script` printed. *BPF ns/sample* is the kernel's BPF statistics (run time over runs \
of icecore's entry program, tail calls included). *frames/sample* counts native and \
interpreter frames walked in BPF. *BPF maps* is the kernel memory of every icecore map, \
inner maps included (`icecore_bpf_map_bytes`). *samples/expected* compares samples \
received with rate × CPUs × time. *throughput* is each workload's rate against the mean \
of the windows without a profiler just before and after (the `none` rows).";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_is_civil() {
        let d = utc_now();
        assert!(
            d.len() == 20 && d.ends_with(" UTC") && d.starts_with("20"),
            "{d}"
        );
    }

    #[test]
    fn renders_targets_and_deltas() {
        let report = Report {
            machine: Machine::default(),
            window_seconds: 30,
            workloads: vec!["native"],
            baselines: vec![
                Row {
                    profiler: "none",
                    throughput: vec![Some(1000.0)],
                    ..Row::default()
                },
                Row {
                    profiler: "none",
                    throughput: vec![Some(1100.0)],
                    ..Row::default()
                },
            ],
            rows: vec![Row {
                profiler: "icecore",
                frequency_hz: Some(19),
                cpu_share: Some(0.0005),
                us_per_sample: Some(6.0),
                bpf_ns_per_sample: Some(3500.0),
                frames_per_sample: Some(10.0),
                throughput: vec![Some(990.0)],
                reference: vec![Some(1000.0)],
                ..Row::default()
            }],
            self_profiles: vec![],
        };
        let text = report.markdown();
        assert!(text.contains("| -1.0 % |"), "{text}");
        assert!(text.contains("| 0.050 % | met |"), "{text}");
        assert!(text.contains("| 6.00 µs | **missed** |"), "{text}");
        assert!(text.contains("= 4000 ns | 3500 ns | met |"), "{text}");
        assert!(text.contains("| – | not measured |"), "{text}");
        assert!(text.contains("from -4.8 % to +4.8 %"), "{text}");
    }
}
