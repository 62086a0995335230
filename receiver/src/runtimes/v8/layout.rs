//! The frame and object layout icecore needs of one V8, resolved from the
//! binary's own `v8dbg_*` constants; the few values a version does not
//! export come from [`FALLBACKS`], each with where it was found.

use super::introspection::{V8Binary, V8Version};

/// A value some V8 versions do not export: `name` (as its `v8dbg_` symbol
/// would be named, without the type suffix) for versions `from..=to`.
#[derive(Debug, Clone, Copy)]
pub struct Fallback {
    /// The constant, `class_<Class>__<field>` or a plain name.
    pub name: &'static str,
    /// First version (major, minor) it applies to.
    pub from: (u32, u32),
    /// Last version it applies to.
    pub to: (u32, u32),
    /// The value.
    pub value: i64,
    /// Where it comes from.
    pub source: &'static str,
}

/// The values missing from some versions' `v8dbg_*` symbols.
pub const FALLBACKS: &[Fallback] = &[
    Fallback {
        name: "FirstJSFunctionType",
        from: (10, 0),
        to: (10, 9),
        value: 2065,
        source: "instance-type.h (JS_FUNCTION_TYPE); the map of `function(){}` in Node 18.20.8",
    },
    Fallback {
        name: "LastJSFunctionType",
        from: (10, 0),
        to: (10, 9),
        value: 2080,
        source: "JS_CLASS_CONSTRUCTOR_TYPE; the map of `class A {}` in Node 18.20.8",
    },
    Fallback {
        name: "FirstJSFunctionType",
        from: (11, 0),
        to: (11, 9),
        value: 2066,
        source: "instance-type.h (JS_FUNCTION_TYPE); the map of `function(){}` in Node 20.20.2",
    },
    Fallback {
        name: "LastJSFunctionType",
        from: (11, 0),
        to: (11, 9),
        value: 2081,
        source: "JS_CLASS_CONSTRUCTOR_TYPE; the map of `class A {}` in Node 20.20.2",
    },
    Fallback {
        name: "class_JSFunction__code",
        from: (11, 0),
        to: (11, 9),
        value: 48,
        source: "js-function.tq (V8 11.3: after feedback_cell); Builtins_CallFunction loads [rdi+0x2f]",
    },
    Fallback {
        name: "class_Code__instruction_start",
        from: (11, 0),
        to: (11, 9),
        value: 40,
        source: "code.h (V8 11.3); Builtins_CallFunction jumps to [code+0x27]",
    },
    Fallback {
        name: "class_Code__flags",
        from: (11, 0),
        to: (11, 9),
        value: 48,
        source: "code.h (V8 11.3), checked on live Code objects of Node 20.20.2",
    },
    Fallback {
        name: "class_Code__instruction_size",
        from: (11, 0),
        to: (11, 9),
        value: 56,
        source: "code.h (V8 11.3), checked on live Code objects of Node 20.20.2",
    },
    Fallback {
        name: "class_BytecodeArray__source_position_table",
        from: (10, 0),
        to: (11, 9),
        value: 32,
        source: "code.tq (BytecodeArray: constant_pool 16, handler_table 24, source_position_table 32)",
    },
    Fallback {
        name: "class_BytecodeArray__source_position_table",
        from: (12, 0),
        to: (13, 9),
        value: 24,
        source: "bytecode-array.tq (V8 12: wrapper 16, source_position_table 24)",
    },
    Fallback {
        name: "class_Code__bytecode_or_interpreter_data",
        from: (10, 0),
        to: (10, 9),
        value: 16,
        source: "code.h (V8 10.2: deoptimization_data_or_interpreter_data at 16), baseline Code of Node 18.20.8",
    },
    Fallback {
        name: "class_Code__bytecode_or_interpreter_data",
        from: (12, 0),
        to: (13, 9),
        value: 8,
        source: "code.h (V8 12: deoptimization_data_or_interpreter_data at 8), baseline Code of Node 22.23.3",
    },
    Fallback {
        name: "class_SharedFunctionInfo__function_data",
        from: (12, 0),
        to: (13, 9),
        value: 8,
        source: "shared-function-info.tq (trusted_function_data / untrusted_function_data at 8, no sandbox)",
    },
    Fallback {
        name: "class_Code__source_position_table",
        from: (10, 0),
        to: (10, 9),
        value: 24,
        source: "code.h (V8 10.2: relocation_info 8, deoptimization_data_or_interpreter_data 16, position_table 24)",
    },
    Fallback {
        name: "class_Code__source_position_table",
        from: (12, 0),
        to: (13, 9),
        value: 16,
        source: "code.h (V8 12: deoptimization_data_or_interpreter_data 8, position_table 16)",
    },
    Fallback {
        name: "class_Code__deoptimization_data",
        from: (10, 0),
        to: (10, 9),
        value: 16,
        source: "code.h (V8 10.2: deoptimization_data_or_interpreter_data at 16)",
    },
    Fallback {
        name: "class_Code__deoptimization_data",
        from: (12, 0),
        to: (13, 9),
        value: 8,
        source: "code.h (V8 12: deoptimization_data_or_interpreter_data at 8)",
    },
    Fallback {
        name: "DeoptimizationDataInlinedFunctionCountIndex",
        from: (10, 0),
        to: (10, 9),
        value: 1,
        source: "code.h:1115-1126 (V8 10.2: DeoptimizationData indices), checked on live TurboFan code of Node 18.20.8",
    },
    Fallback {
        name: "DeoptimizationDataLiteralArrayIndex",
        from: (10, 0),
        to: (10, 9),
        value: 2,
        source: "code.h:1115-1126 (V8 10.2), checked on live TurboFan code of Node 18.20.8",
    },
    Fallback {
        name: "DeoptimizationDataInliningPositionsIndex",
        from: (10, 0),
        to: (10, 9),
        value: 7,
        source: "code.h:1115-1126 (V8 10.2), checked on live TurboFan code of Node 18.20.8",
    },
    Fallback {
        name: "class_JSFunction__dispatch_handle",
        from: (13, 0),
        to: (13, 9),
        value: 24,
        source: "js-function.tq (V8 13, leap-tiering: dispatch_handle first); %DebugPrint in Node 24.21.0",
    },
    Fallback {
        name: "IsolateGroup__js_dispatch_table",
        from: (13, 6),
        to: (13, 6),
        value: 0x3270,
        source: "ExternalReference::js_dispatch_table_address() in Node 24.21.0: mov rax,[default_isolate_group_]; mov rax,[rax+0x3270]",
    },
];

/// Frame types (`StackFrame::Type`) the walk tells apart; a typed frame
/// stores `type << 1` in its context slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTypes {
    /// `ENTRY`: C++ calling into JavaScript.
    pub entry: i64,
    /// `CONSTRUCT_ENTRY`: C++ calling a constructor.
    pub construct_entry: i64,
    /// `EXIT`: JavaScript calling a C++ runtime function.
    pub exit: i64,
    /// `BUILTIN_EXIT`: a C++ builtin.
    pub builtin_exit: i64,
    /// `INTERPRETED`.
    pub interpreted: i64,
    /// `BASELINE` (Sparkplug).
    pub baseline: i64,
}

/// What the V8 unwinder and symbolizer read, in bytes (object offsets
/// from the untagged object start; frame slots from the frame pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct V8Layout {
    /// The frame slot holding a JavaScript frame's context, or a typed
    /// frame's type marker.
    pub fp_context_or_marker: i64,
    /// The frame slot holding a JavaScript frame's JSFunction.
    pub fp_function: i64,
    /// The interpreted frame's BytecodeArray slot.
    pub fp_bytecode_array: i64,
    /// The interpreted frame's bytecode offset slot (a Smi, biased by
    /// [`Self::bytecode_offset_bias`]).
    pub fp_bytecode_offset: i64,
    /// Frame type numbers.
    pub frame_types: FrameTypes,
    /// `Map::instance_type` (u16).
    pub map_instance_type: u64,
    /// The instance types of JSFunctions, first and last (class constructors).
    pub js_function_types: (u16, u16),
    /// `JSFunction::shared`.
    pub js_function_shared: u64,
    /// `JSFunction::code`; `None` where a function's code is found through
    /// the JS dispatch table (V8 13 with leap-tiering).
    pub js_function_code: Option<u64>,
    /// What an interpreted frame's Smi adds to the bytecode offset: the
    /// BytecodeArray header minus the heap-object tag (the interpreter
    /// keeps the offset as a tagged pointer's distance).
    pub bytecode_offset_bias: i64,
    /// `Code::instruction_start`: where the instructions start
    /// ([`Self::code_instructions_inline`]) or the field pointing to them.
    pub code_instruction_start: u64,
    /// Whether a Code object's instructions follow its header (V8 10);
    /// since V8 11 they are in an InstructionStream the Code points to.
    pub code_instructions_inline: bool,
    /// `Code::flags` (u32; the kind in its low bits).
    pub code_flags: u64,
    /// `CodeKind::BASELINE`; Maglev and TurboFan follow it.
    pub code_kind_baseline: i64,
    /// `SharedFunctionInfo::name_or_scope_info`.
    pub sfi_name_or_scope_info: u64,
    /// `SharedFunctionInfo::script_or_debug_info` (`script` in V8 13).
    pub sfi_script: u64,
    /// `SharedFunctionInfo::function_data`.
    pub sfi_function_data: u64,
    /// `SHARED_FUNCTION_INFO_TYPE`.
    pub shared_function_info_type: u16,
    /// `CODE_TYPE`.
    pub code_type: u16,
    /// `BYTECODE_ARRAY_TYPE`.
    pub bytecode_array_type: u16,
    /// `SCRIPT_TYPE`.
    pub script_type: u16,
    /// `SCOPE_INFO_TYPE`.
    pub scope_info_type: u16,
    /// The first instance type that is not a string.
    pub first_nonstring_type: u16,
    /// Where the strings keep what [`StringLayout`] names.
    pub strings: StringLayout,
    /// ScopeInfo: where a function's name is.
    pub scope_info: ScopeInfoLayout,
    /// Where a function's source positions and script are.
    pub source: SourceLayout,
    /// Code objects: their positions and kinds.
    pub code: CodeLayout,
}

/// Code objects (what a compiled frame runs) and how a function finds its
/// code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    /// `Code::instruction_size` (i32).
    pub instruction_size: u64,
    /// `Code::source_position_table`: source positions of optimized code,
    /// the bytecode-offset table of baseline code.
    pub position_table: u64,
    /// `Code::deoptimization_data` (optimized code).
    pub deoptimization_data: u64,
    /// Where a JSFunction's dispatch handle is, and where the isolate
    /// group keeps the dispatch table (V8 13, which has no code field).
    pub dispatch: Option<(u64, u64)>,
    /// Elements of an optimized Code's DeoptimizationData: the inlined
    /// function count, the literal array (the inlined functions first)
    /// and the inlining positions.
    pub deopt_indices: [u64; 3],
    /// The object whose header precedes the instructions: its instance
    /// type and header size; since V8 11 an InstructionStream, whose
    /// second word points back to its Code, before it the Code itself.
    pub header_object: (u16, u64),
}

/// From a function to its script, and from a bytecode offset to a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLayout {
    /// `BytecodeArray::source_position_table` (a ByteArray once collected).
    pub bytecode_positions: u64,
    /// A baseline Code's BytecodeArray (or InterpreterData).
    pub code_bytecode: u64,
    /// `InterpreterData::bytecode_array`.
    pub interpreter_data_bytecode: u64,
    /// `Script::source`.
    pub script_source: u64,
    /// `Script::name`.
    pub script_name: u64,
    /// `Script::line_ends` (a FixedArray of Smis once computed).
    pub script_line_ends: u64,
    /// `DebugInfo::script`, where a SharedFunctionInfo's script slot may
    /// hold a DebugInfo (V8 before 12).
    pub debug_info_script: Option<u64>,
    /// `INTERPRETER_DATA_TYPE`.
    pub interpreter_data_type: u16,
    /// `DEBUG_INFO_TYPE`.
    pub debug_info_type: u16,
    /// `FIXED_ARRAY_TYPE`.
    pub fixed_array_type: u16,
}

/// String objects: lengths, characters and the parts of indirect strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StringLayout {
    /// `String::length` (i32).
    pub length: u64,
    /// The characters of a sequential string.
    pub seq_chars: u64,
    /// `ConsString::first`.
    pub cons_first: u64,
    /// `ConsString::second`.
    pub cons_second: u64,
    /// `ThinString::actual`.
    pub thin_actual: u64,
    /// `SlicedString::parent`.
    pub sliced_parent: u64,
    /// `SlicedString::offset` (a Smi).
    pub sliced_offset: u64,
    /// An external string's pointer to its characters
    /// (`ExternalString::resource_data`, after its resource).
    pub external_data: u64,
}

/// ScopeInfo: a header of Smis (a raw `u32` of flags in V8 13), then
/// variable-length parts whose presence the flags say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeInfoLayout {
    /// Whether the flags are a raw `u32` (V8 13) rather than a Smi.
    pub raw_flags: bool,
    /// The context-local count (a Smi).
    pub context_local_count: u64,
    /// The first variable-length slot.
    pub first_variable: u64,
    /// `ScopeType::MODULE_SCOPE`, whose scopes start with a module
    /// variable count in V8 12 and later.
    pub module_scope_type: u32,
    /// Whether module scopes have that count.
    pub module_variable_count: bool,
}

/// A value icecore needs that the binary neither exports nor has a
/// fallback for: this V8 is not supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("V8 {version} exports no v8dbg_{name}, and icecore knows no value for it")]
pub struct MissingConstant {
    /// The version.
    pub version: V8Version,
    /// The constant.
    pub name: String,
}

/// Resolves the layout of `binary`.
pub fn resolve(binary: &V8Binary) -> Result<V8Layout, MissingConstant> {
    let version = binary.version;
    let missing = |name: &str| MissingConstant {
        version,
        name: name.to_owned(),
    };
    // A constant by its full name, a field by `class_<C>__<f>__` whatever
    // its type suffix, else a fallback.
    let value = |name: &str| -> Result<i64, MissingConstant> {
        binary
            .constant(name)
            .or_else(|| field(binary, name))
            .or_else(|| fallback(version, name))
            .ok_or_else(|| missing(name))
    };
    let offset = |name: &str| -> Result<u64, MissingConstant> {
        u64::try_from(value(name)?).map_err(|_| missing(name))
    };
    let instance_type = |name: &str| -> Result<u16, MissingConstant> {
        u16::try_from(value(name)?).map_err(|_| missing(name))
    };
    let frame_type = |name: &str| value(&format!("frametype_{name}"));
    let code_type = instance_type("type_Code__CODE_TYPE")?;
    // V8 13 moved a function's code into the dispatch table: no field.
    let js_function_code = match value("class_JSFunction__code") {
        Ok(at) => Some(u64::try_from(at).map_err(|_| missing("class_JSFunction__code"))?),
        Err(_) if version.major >= 13 => None,
        Err(e) => return Err(e),
    };
    Ok(V8Layout {
        fp_context_or_marker: value("off_fp_context_or_frame_type")?,
        fp_function: value("off_fp_function")?,
        fp_bytecode_array: value("off_fp_bytecode_array")?,
        fp_bytecode_offset: value("off_fp_bytecode_offset")?,
        frame_types: FrameTypes {
            entry: frame_type("EntryFrame")?,
            construct_entry: frame_type("ConstructEntryFrame")?,
            exit: frame_type("ExitFrame")?,
            builtin_exit: frame_type("BuiltinExitFrame")?,
            interpreted: frame_type("InterpretedFrame")?,
            baseline: frame_type("BaselineFrame")?,
        },
        map_instance_type: offset("class_Map__instance_type")?,
        js_function_types: (
            instance_type("FirstJSFunctionType")?,
            instance_type("LastJSFunctionType")?,
        ),
        js_function_shared: offset("class_JSFunction__shared")?,
        js_function_code,
        bytecode_offset_bias: value("class_BytecodeArray__data")? - value("HeapObjectTag")?,
        code_instruction_start: offset("class_Code__instruction_start")?,
        code_instructions_inline: version.major < 11,
        code_flags: offset("class_Code__flags")?,
        code_kind_baseline: value("CodeKindBaseline")?,
        sfi_name_or_scope_info: offset("class_SharedFunctionInfo__name_or_scope_info")?,
        sfi_script: offset("class_SharedFunctionInfo__script_or_debug_info")
            .or_else(|_| offset("class_SharedFunctionInfo__script"))?,
        sfi_function_data: offset("class_SharedFunctionInfo__function_data")?,
        shared_function_info_type: instance_type(
            "type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
        )?,
        code_type,
        bytecode_array_type: instance_type("type_BytecodeArray__BYTECODE_ARRAY_TYPE")?,
        script_type: instance_type("type_Script__SCRIPT_TYPE")?,
        scope_info_type: instance_type("type_ScopeInfo__SCOPE_INFO_TYPE")?,
        first_nonstring_type: instance_type("FirstNonstringType")?,
        strings: StringLayout {
            length: offset("class_String__length")?,
            seq_chars: offset("class_SeqOneByteString__chars")?,
            cons_first: offset("class_ConsString__first")?,
            cons_second: offset("class_ConsString__second")?,
            thin_actual: offset("class_ThinString__actual")?,
            sliced_parent: offset("class_SlicedString__parent")?,
            sliced_offset: offset("class_SlicedString__offset")?,
            external_data: offset("class_ExternalString__resource")? + 8,
        },
        scope_info: ScopeInfoLayout {
            raw_flags: version.major >= 13,
            context_local_count: 8 + 8 * offset("scopeinfo_idx_ncontextlocals")?,
            first_variable: 8 + 8 * offset("scopeinfo_idx_first_vars")?,
            // scope-type.h: MODULE_SCOPE is 3 until V8 13 put SCRIPT and
            // REPL_MODE first.
            module_scope_type: if version.major >= 13 { 5 } else { 3 },
            module_variable_count: version.major >= 12,
        },
        source: SourceLayout {
            bytecode_positions: offset("class_BytecodeArray__source_position_table")?,
            code_bytecode: offset("class_Code__bytecode_or_interpreter_data")?,
            // interpreter-data.tq: bytecode_array right after the map.
            interpreter_data_bytecode: 8,
            script_source: offset("class_Script__source")?,
            script_name: offset("class_Script__name")?,
            script_line_ends: offset("class_Script__line_ends")?,
            // debug-objects.tq (V8 10-11): shared 8, debugger_hints 16, script 24.
            debug_info_script: (version.major < 12).then_some(24),
            interpreter_data_type: instance_type("type_InterpreterData__INTERPRETER_DATA_TYPE")?,
            debug_info_type: instance_type("type_DebugInfo__DEBUG_INFO_TYPE")?,
            fixed_array_type: instance_type("type_FixedArray__FIXED_ARRAY_TYPE")?,
        },
        code: CodeLayout {
            instruction_size: offset("class_Code__instruction_size")?,
            position_table: offset("class_Code__source_position_table")?,
            deoptimization_data: offset("class_Code__deoptimization_data")?,
            deopt_indices: [
                offset("DeoptimizationDataInlinedFunctionCountIndex")?,
                offset("DeoptimizationDataLiteralArrayIndex")?,
                offset("DeoptimizationDataInliningPositionsIndex")?,
            ],
            header_object: if version.major < 11 {
                (code_type, offset("class_Code__instruction_start")?)
            } else {
                (
                    instance_type("type_InstructionStream__INSTRUCTION_STREAM_TYPE")?,
                    offset("class_InstructionStream__instruction_start")?,
                )
            },
            dispatch: match js_function_code {
                Some(_) => None,
                None => Some((
                    offset("class_JSFunction__dispatch_handle")?,
                    offset("IsolateGroup__js_dispatch_table")?,
                )),
            },
        },
    })
}

/// `class_<Class>__<field>__<type>` for `name` = `class_<Class>__<field>`,
/// whatever the type suffix (it changes between versions).
fn field(binary: &V8Binary, name: &str) -> Option<i64> {
    if !name.starts_with("class_") {
        return None;
    }
    binary.constant_with_prefix(&format!("{name}__"))
}

fn fallback(version: V8Version, name: &str) -> Option<i64> {
    let at = (version.major, version.minor);
    FALLBACKS
        .iter()
        .find(|f| f.name == name && f.from <= at && at <= f.to)
        .map(|f| f.value)
}
