//! The YAML config file (`--config`): read, parsed, validated and resolved
//! by `Config::from_file`, as `icecore --config FILE --check-config` does;
//! then what the agent does with a config that loads: its relabel rules
//! applied to a process's labels, its targets matched against a process,
//! its error message printed.

use std::collections::BTreeMap;

use icecore_config::Config;
use icecore_config::targets::TargetFacts;

struct Process;

impl TargetFacts for Process {
    fn pid(&self) -> u32 {
        4242
    }
    fn executable_path(&self) -> &str {
        "/usr/bin/python3.11"
    }
    fn executable_name(&self) -> &str {
        "python3.11"
    }
    fn cgroup(&self) -> &str {
        "/system.slice/app.service"
    }
    fn container_id(&self) -> &str {
        "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
    }
    fn kubernetes_namespace(&self) -> Option<&str> {
        Some("default")
    }
    fn kubernetes_pod_label(&self, name: &str) -> Option<&str> {
        (name == "app").then_some("checkout")
    }
}

/// Runs one input through the entry points above; panics are the bugs
/// looked for (errors are expected answers to bad input).
pub fn run(data: &[u8]) {
    let path = crate::scratch_file("config", data);
    match Config::from_file(&path) {
        Ok(config) => {
            let labels: BTreeMap<String, String> = [
                ("__meta_process_pid", "4242"),
                ("__meta_process_executable_name", "python3.11"),
                ("__meta_process_cmdline", "python3.11 -m app --port 80"),
                ("__meta_thread_comm", "worker"),
                ("__meta_cpuid", "3"),
                ("__meta_kubernetes_pod_label_app", "checkout"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            let _ = config.relabel_configs.apply(labels);
            let _ = config.relabel_configs.reads_thread_labels();
            let _ = config.targets.selects(&Process);
            let _ = config.period_nanos();
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = e.exit_code();
        }
    }
}
