//! The runtime registry: one descriptor per runtime, the single source of
//! truth for its name (log lines, metrics, the `--runtimes` switch), the
//! OTel frame type of its frames, its BPF half and how its plugin is built.

use icecore_otlp::model::FrameKind;
use icecore_unwinders::{
    BpfRuntime, hotspot::HOTSPOT, perl::PERL, php::PHP, python::CPYTHON, ruby::CRUBY, v8::V8,
};

use super::{
    RuntimePlugin, hotspot::plugin::HotSpotPlugin, perf_map::PerfMapPlugin, perl::PerlPlugin,
    php::PhpPlugin, python::PythonPlugin, ruby::RubyPlugin, v8::plugin::V8Plugin,
};
use crate::sampler::{CpuSampler, SamplerError};

/// One runtime icecore can unwind or symbolize.
pub struct RuntimeDescriptor {
    /// Stable name: the `--runtimes` value, the `runtime` metric label.
    pub name: &'static str,
    /// What it covers, for `--help` and logs.
    pub summary: &'static str,
    /// The `profile.frame.type` of its frames (a plugin naming code of
    /// several runtimes, such as perf maps, sets each frame's own).
    pub frame_kind: FrameKind,
    /// Its BPF program, slot, tags and counters; `None` when it needs none.
    pub bpf: Option<&'static BpfRuntime>,
    /// Builds its plugin, taking what it needs from the loaded BPF object.
    pub build: fn(&mut CpuSampler) -> Result<Box<dyn RuntimePlugin>, SamplerError>,
}

impl std::fmt::Debug for RuntimeDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeDescriptor")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// CPython 3.8–3.15.
pub static CPYTHON_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: CPYTHON.name,
    summary: "CPython 3.8-3.15: Python functions, files and lines",
    frame_kind: FrameKind::CPython,
    bpf: Some(&CPYTHON),
    build: |sampler| {
        let map = sampler.runtime_process_map(&CPYTHON, "PYTHON_PROCESSES")?;
        Ok(Box::new(PythonPlugin::new(Box::new(map))))
    },
};

/// CRuby 3.1–3.4.
pub static CRUBY_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: CRUBY.name,
    summary: "CRuby 3.1-3.4: Ruby methods with their classes, files and lines, C functions named",
    frame_kind: FrameKind::Ruby,
    bpf: Some(&CRUBY),
    build: |sampler| {
        let map = sampler.runtime_process_map(&CRUBY, "RUBY_PROCESSES")?;
        Ok(Box::new(RubyPlugin::new(Box::new(map))))
    },
};

/// HotSpot (OpenJDK 11–25).
pub static HOTSPOT_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: HOTSPOT.name,
    summary: "HotSpot JVMs (OpenJDK 11-25): Java methods, inlined ones included, files and lines",
    frame_kind: FrameKind::Jvm,
    bpf: Some(&HOTSPOT),
    build: |sampler| {
        let map = sampler.runtime_process_map(&HOTSPOT, "HOTSPOT_PROCESSES")?;
        Ok(Box::new(HotSpotPlugin::new(Box::new(map))))
    },
};

/// V8 (Node.js 18-24).
pub static V8_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: V8.name,
    summary: "V8 (Node.js 18-24): JavaScript functions, inlined ones included, scripts and lines, \
              without any Node flag",
    frame_kind: FrameKind::V8Js,
    bpf: Some(&V8),
    build: |sampler| {
        let map = sampler.runtime_process_map(&V8, "V8_PROCESSES")?;
        Ok(Box::new(V8Plugin::new(Box::new(map))))
    },
};

/// PHP 8.0–8.5 (NTS builds).
pub static PHP_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: PHP.name,
    summary: "PHP 8.0-8.5 (php, php-fpm, libphp; opcache JIT on or off): functions with their \
              classes, files and lines, internal functions named",
    frame_kind: FrameKind::Php,
    bpf: Some(&PHP),
    build: |sampler| {
        let map = sampler.runtime_process_map(&PHP, "PHP_PROCESSES")?;
        Ok(Box::new(PhpPlugin::new(Box::new(map))))
    },
};

/// Perl 5.36–5.44 (threaded builds, as Debian's).
pub static PERL_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: PERL.name,
    summary: "Perl 5.36-5.44: subs with their packages, files and lines, evals and the main \
              program, XS functions in place",
    frame_kind: FrameKind::Perl,
    bpf: Some(&PERL),
    build: |sampler| {
        let map = sampler.runtime_process_map(&PERL, "PERL_PROCESSES")?;
        Ok(Box::new(PerlPlugin::new(Box::new(map))))
    },
};

/// JIT code named from `/tmp/perf-PID.map` and `jit-PID.dump`.
pub static PERF_MAP_RUNTIME: RuntimeDescriptor = RuntimeDescriptor {
    name: "perf-map",
    summary: "JIT code walked with frame pointers and named from perf maps \
              (Node.js --perf-basic-prof, .NET DOTNET_PerfMapEnabled=1, Erlang, Julia, ...)",
    frame_kind: FrameKind::Native,
    bpf: None,
    build: |_| Ok(Box::new(PerfMapPlugin::new())),
};

/// Every runtime, in the order plugins are offered a process.
pub static RUNTIMES: [&RuntimeDescriptor; 7] = [
    &CPYTHON_RUNTIME,
    &CRUBY_RUNTIME,
    &HOTSPOT_RUNTIME,
    &V8_RUNTIME,
    &PHP_RUNTIME,
    &PERL_RUNTIME,
    &PERF_MAP_RUNTIME,
];

/// The descriptor named `name`.
pub fn by_name(name: &str) -> Option<&'static RuntimeDescriptor> {
    RUNTIMES.iter().copied().find(|r| r.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bpf_runtime_is_registered_once_and_names_are_the_configs() {
        for bpf in icecore_unwinders::BPF_RUNTIMES {
            let registered = RUNTIMES
                .iter()
                .filter(|r| r.bpf.is_some_and(|b| b.name == bpf.name))
                .count();
            assert_eq!(registered, 1, "{}", bpf.name);
        }
        let names: Vec<&str> = RUNTIMES.iter().map(|r| r.name).collect();
        assert_eq!(names, icecore_config::RUNTIME_NAMES);
        for r in RUNTIMES {
            assert!(by_name(r.name).is_some());
            if let Some(bpf) = r.bpf {
                assert_eq!(bpf.name, r.name);
            }
        }
    }
}
