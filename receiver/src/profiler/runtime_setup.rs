//! Which runtimes run: each enabled runtime's plugin is built when its BPF
//! program (if it has one) loaded, and each runtime's state is reported.

use tracing::{info, warn};

use super::RuntimeState;
use crate::{
    runtimes::{RuntimePlugin, registry},
    sampler::{CpuSampler, RuntimeLoad},
};

/// Each runtime's name and state.
pub(super) type RuntimeStates = Vec<(&'static str, RuntimeState)>;

/// Builds the plugin of every enabled runtime whose BPF program (if any)
/// loaded, and says what became of each runtime.
pub(super) fn start_runtimes(
    sampler: &mut CpuSampler,
    enabled: &[&'static str],
    native_tables: bool,
) -> (Vec<Box<dyn RuntimePlugin>>, RuntimeStates) {
    let mut plugins = Vec::new();
    let mut states = Vec::new();
    for runtime in registry::RUNTIMES {
        let state = if !enabled.contains(&runtime.name) {
            RuntimeState::Disabled
        } else if let Some(failure) = runtime.bpf.and_then(|bpf| {
            sampler
                .runtime_loads()
                .iter()
                .find_map(|(r, load)| match load {
                    RuntimeLoad::Failed(why) if r.name == bpf.name => Some(why.clone()),
                    _ => None,
                })
        }) {
            RuntimeState::Failed(failure)
        } else if runtime.bpf.is_some() && !native_tables {
            // Runtime code is dispatched from the native unwinder's tables.
            warn!(
                runtime = runtime.name,
                "runtime off: the native unwinder's tables are off"
            );
            RuntimeState::Failed("the native unwinder's tables are off".into())
        } else {
            match (runtime.build)(sampler) {
                Ok(plugin) => {
                    plugins.push(plugin);
                    RuntimeState::Running
                }
                Err(e) => {
                    warn!(runtime = runtime.name, "runtime off: {e}");
                    RuntimeState::Failed(e.to_string())
                }
            }
        };
        states.push((runtime.name, state));
    }
    let running: Vec<&str> = states
        .iter()
        .filter(|(_, s)| *s == RuntimeState::Running)
        .map(|(n, _)| *n)
        .collect();
    info!(runtimes = ?running, "runtime unwinders");
    (plugins, states)
}
