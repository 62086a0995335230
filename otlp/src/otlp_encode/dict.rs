//! The request-wide `ProfilesDictionary` builder: every table starts with its
//! zero element and deduplicates by value, so indices are stable and tables
//! hold no duplicates.

use std::collections::HashMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, ProfilesDictionary, Stack,
};

use crate::model;

/// `profile.frame.type` (set on locations).
pub const ATTR_FRAME_TYPE: &str = "profile.frame.type";
/// GNU build ID of a mapped file (set on mappings).
pub const ATTR_BUILD_ID_GNU: &str = "process.executable.build_id.gnu";

/// The value of a dictionary attribute, borrowed from the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AttrValue<'a> {
    /// An `AnyValue.string_value`.
    Str(&'a str),
    /// An `AnyValue.int_value`.
    Int(i64),
}

/// Value identity of a `Location` (the proto type is not `Hash`).
#[derive(PartialEq, Eq, Hash)]
struct LocationKey {
    mapping_index: i32,
    address: u64,
    lines: Vec<Line>,
    attribute_indices: Vec<i32>,
}

/// Builds one `ProfilesDictionary`. Lookups borrow from the batch (`'a`), so
/// keys cost no allocation; pointer-keyed caches skip re-deriving frames and
/// mappings that the source already interned as shared `Arc`s.
pub(crate) struct DictBuilder<'a> {
    dict: ProfilesDictionary,
    strings: HashMap<&'a str, i32>,
    functions: HashMap<Function, i32>,
    mappings: HashMap<Mapping, i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, AttrValue<'a>, i32), i32>,
    // Pointers stay valid: the batch is borrowed for 'a, keeping every Arc alive.
    mapping_by_ptr: HashMap<*const model::Mapping, i32>,
    location_by_ptr: HashMap<*const model::Frame, i32>,
    stack_by_ptr: HashMap<(*const Arc<model::Frame>, usize), i32>,
}

impl<'a> DictBuilder<'a> {
    /// A builder whose seven tables each hold only their zero element.
    pub(crate) fn new() -> Self {
        let dict = ProfilesDictionary {
            mapping_table: vec![Mapping::default()],
            location_table: vec![Location::default()],
            function_table: vec![Function::default()],
            // Parca checks link IDs by length, so the null link is all-zero IDs, not empty ones.
            link_table: vec![Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: vec![String::new()],
            attribute_table: vec![KeyValueAndUnit::default()],
            stack_table: vec![Stack::default()],
        };
        let mut strings = HashMap::new();
        strings.insert("", 0);
        Self {
            dict,
            strings,
            functions: HashMap::from([(Function::default(), 0)]),
            mappings: HashMap::from([(Mapping::default(), 0)]),
            locations: HashMap::new(),
            stacks: HashMap::from([(Vec::new(), 0)]),
            attributes: HashMap::new(),
            mapping_by_ptr: HashMap::new(),
            location_by_ptr: HashMap::new(),
            stack_by_ptr: HashMap::new(),
        }
    }

    /// The finished dictionary.
    pub(crate) fn finish(self) -> ProfilesDictionary {
        self.dict
    }

    /// Index of `s` in the string table.
    pub(crate) fn string(&mut self, s: &'a str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = next_index(self.dict.string_table.len());
        self.dict.string_table.push(s.to_owned());
        self.strings.insert(s, i);
        i
    }

    /// Index of the attribute `key = value` (no unit) in the attribute table.
    pub(crate) fn attribute(&mut self, key: &'a str, value: AttrValue<'a>) -> i32 {
        self.attribute_with_unit(key, value, "")
    }

    /// Index of the attribute `key = value` in `unit` in the attribute table.
    pub(crate) fn attribute_with_unit(
        &mut self,
        key: &'a str,
        value: AttrValue<'a>,
        unit: &'a str,
    ) -> i32 {
        let key_strindex = self.string(key);
        let unit_strindex = self.string(unit);
        if let Some(&i) = self.attributes.get(&(key_strindex, value, unit_strindex)) {
            return i;
        }
        // Plain string_value, not string_value_strindex: Parca and Pyroscope read only the former.
        let any = match value {
            AttrValue::Str(s) => any_value::Value::StringValue(s.to_owned()),
            AttrValue::Int(n) => any_value::Value::IntValue(n),
        };
        let i = next_index(self.dict.attribute_table.len());
        self.dict.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(any) }),
            unit_strindex,
        });
        self.attributes
            .insert((key_strindex, value, unit_strindex), i);
        i
    }

    fn function(&mut self, line: &'a model::Line) -> i32 {
        let function = Function {
            name_strindex: self.string(&line.function_name),
            system_name_strindex: self.string(&line.system_name),
            filename_strindex: line.filename.as_deref().map_or(0, |f| self.string(f)),
            start_line: 0,
        };
        self.intern_function(function)
    }

    /// Index of `function` in the function table.
    pub(crate) fn intern_function(&mut self, function: Function) -> i32 {
        let table = &mut self.dict.function_table;
        *self.functions.entry(function).or_insert_with(|| {
            table.push(function);
            next_index(table.len() - 1)
        })
    }

    fn mapping(&mut self, mapping: &'a Arc<model::Mapping>) -> i32 {
        let ptr = Arc::as_ptr(mapping);
        if let Some(&i) = self.mapping_by_ptr.get(&ptr) {
            return i;
        }
        let attribute_indices = match mapping.build_id.as_deref() {
            Some(id) if !id.is_empty() => {
                vec![self.attribute(ATTR_BUILD_ID_GNU, AttrValue::Str(id))]
            }
            _ => Vec::new(),
        };
        let proto = Mapping {
            memory_start: mapping.memory_start,
            memory_limit: mapping.memory_limit,
            file_offset: mapping.file_offset,
            filename_strindex: self.string(&mapping.filename),
            attribute_indices,
        };
        let i = self.intern_mapping(proto);
        self.mapping_by_ptr.insert(ptr, i);
        i
    }

    /// Index of `mapping` in the mapping table.
    pub(crate) fn intern_mapping(&mut self, mapping: Mapping) -> i32 {
        match self.mappings.get(&mapping) {
            Some(&i) => i,
            None => {
                let i = next_index(self.dict.mapping_table.len());
                self.dict.mapping_table.push(mapping.clone());
                self.mappings.insert(mapping, i);
                i
            }
        }
    }

    fn location(&mut self, frame: &'a Arc<model::Frame>) -> i32 {
        let ptr = Arc::as_ptr(frame);
        if let Some(&i) = self.location_by_ptr.get(&ptr) {
            return i;
        }
        let mapping_index = frame.mapping.as_ref().map_or(0, |m| self.mapping(m));
        // Model lines are innermost first, as OTLP wants.
        let lines = frame
            .lines
            .iter()
            .map(|line| Line {
                function_index: self.function(line),
                line: i64::from(line.line),
                column: i64::from(line.column),
            })
            .collect();
        let frame_type = self.attribute(ATTR_FRAME_TYPE, AttrValue::Str(frame.kind.as_otel_str()));
        let i = self.intern_location(Location {
            mapping_index,
            address: frame.address,
            lines,
            attribute_indices: vec![frame_type],
        });
        self.location_by_ptr.insert(ptr, i);
        i
    }

    /// Index of `location` in the location table.
    pub(crate) fn intern_location(&mut self, location: Location) -> i32 {
        let key = LocationKey {
            mapping_index: location.mapping_index,
            address: location.address,
            lines: location.lines,
            attribute_indices: location.attribute_indices,
        };
        match self.locations.get(&key) {
            Some(&i) => i,
            None => {
                let i = next_index(self.dict.location_table.len());
                self.dict.location_table.push(Location {
                    mapping_index: key.mapping_index,
                    address: key.address,
                    lines: key.lines.clone(),
                    attribute_indices: key.attribute_indices.clone(),
                });
                self.locations.insert(key, i);
                i
            }
        }
    }

    /// Index of `stack` (leaf first, like the model) in the stack table.
    pub(crate) fn stack(&mut self, stack: &'a model::Stack) -> i32 {
        let ptr = (stack.as_ptr(), stack.len());
        if let Some(&i) = self.stack_by_ptr.get(&ptr) {
            return i;
        }
        let location_indices: Vec<i32> = stack.iter().map(|f| self.location(f)).collect();
        let i = self.intern_stack(location_indices);
        self.stack_by_ptr.insert(ptr, i);
        i
    }

    /// Index of the stack of `location_indices` (leaf first) in the stack table.
    pub(crate) fn intern_stack(&mut self, location_indices: Vec<i32>) -> i32 {
        match self.stacks.get(&location_indices) {
            Some(&i) => i,
            None => {
                let i = next_index(self.dict.stack_table.len());
                self.dict.stack_table.push(Stack {
                    location_indices: location_indices.clone(),
                });
                self.stacks.insert(location_indices, i);
                i
            }
        }
    }
}

/// Converts a table length to the `int32` index the wire format uses.
fn next_index(len: usize) -> i32 {
    // A table past i32::MAX entries would not fit the 32 MiB message limit anyway.
    i32::try_from(len).unwrap_or(i32::MAX)
}
