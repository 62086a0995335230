//! User-space half: lets aya read and write the shared structs in maps.

use crate::native::{MappingEntry, ProcessMappingTable, UnwindRow};
use crate::{Registers, SampleHeader, SampleRecord, UnwindScratch, UnwindState};

// SAFETY: all are #[repr(C)], made only of integers and integer arrays, with no
// padding (see the size assertions in sample.rs), so any bit pattern is valid.
unsafe impl aya::Pod for Registers {}
unsafe impl aya::Pod for SampleHeader {}
unsafe impl aya::Pod for SampleRecord {}
unsafe impl aya::Pod for UnwindState {}
unsafe impl aya::Pod for UnwindScratch {}
unsafe impl aya::Pod for UnwindRow {}
unsafe impl aya::Pod for MappingEntry {}
unsafe impl aya::Pod for ProcessMappingTable {}
unsafe impl aya::Pod for crate::events::ProcessEvent {}
unsafe impl aya::Pod for crate::python::PythonProcess {}
unsafe impl aya::Pod for crate::ruby::RubyProcess {}
unsafe impl aya::Pod for crate::hotspot::HotSpotProcess {}
unsafe impl aya::Pod for crate::v8::V8Process {}
unsafe impl aya::Pod for crate::php::PhpProcess {}
unsafe impl aya::Pod for crate::perl::PerlProcess {}
