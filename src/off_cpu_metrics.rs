//! `/metrics` lines of off-CPU sampling: what became of each wait's
//! records, and the cost of the `sched_switch` program.

use std::fmt::Write as _;

use icecore_receiver::OffCpuStats;

/// Appends the off-CPU families to `out`.
pub fn render(out: &mut String, stats: &OffCpuStats) {
    let join = &stats.join;
    let _ = writeln!(
        out,
        "# HELP icecore_off_cpu_records_total Off-CPU start and end records read, by outcome: joined into a wait, a start never answered (a wait shorter than the minimum), an end whose start never came, a start dropped at the pending limit.\n# TYPE icecore_off_cpu_records_total counter"
    );
    for (outcome, value) in [
        ("joined", join.joined),
        ("unanswered", join.unanswered),
        ("orphan_end", join.orphan_ends),
        ("overflow", join.overflow),
    ] {
        let _ = writeln!(
            out,
            "icecore_off_cpu_records_total{{outcome=\"{outcome}\"}} {value}"
        );
    }
    let scalars = [
        (
            "icecore_off_cpu_waits_reported_total",
            "counter",
            "Off-CPU waits put into batches.",
            stats.reported as f64,
        ),
        (
            "icecore_off_cpu_pending_waits",
            "gauge",
            "Sampled waits whose thread has not run again yet.",
            stats.pending as f64,
        ),
        (
            "icecore_off_cpu_bpf_runs_total",
            "counter",
            "Runs of the sched_switch program (one per context switch).",
            stats.bpf_cost.run_count as f64,
        ),
        (
            "icecore_off_cpu_bpf_seconds_total",
            "counter",
            "Kernel-measured time in the sched_switch program and the unwinders it tail-calls.",
            stats.bpf_cost.run_time_ns as f64 / 1e9,
        ),
    ];
    for (name, kind, help, value) in scalars {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_a_labelled_series() {
        let mut stats = OffCpuStats::default();
        stats.join.joined = 7;
        stats.pending = 2;
        let mut out = String::new();
        render(&mut out, &stats);
        assert!(out.contains("icecore_off_cpu_records_total{outcome=\"joined\"} 7"));
        assert!(out.contains("icecore_off_cpu_records_total{outcome=\"orphan_end\"} 0"));
        assert!(out.contains("icecore_off_cpu_pending_waits 2"));
    }
}
