//! The Zend engine's struct layouts on x86-64, per minor version, as data.
//! Patch releases of one minor move none of these fields (fields are only
//! appended to `zend_executor_globals` within a series, after
//! `current_execute_data`). Sources: php-src's headers of each branch
//! (`Zend/zend_globals.h`, `zend_compile.h`, `zend_types.h`; 8.3's offsets
//! agree with reli-prof's and the OpenTelemetry profiler's tables); 8.2,
//! 8.4 and 8.5 are checked against Debian's builds by walking live
//! processes (`walk_tests.rs`, in CI). No 8.0, 8.1 or 8.3 build can be
//! installed here: those three are unchecked.

/// Where the fields icecore reads sit in one PHP minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhpLayout {
    /// (major, minor).
    pub version: (u8, u8),
    /// `zend_executor_globals.current_execute_data`.
    pub eg_current_execute_data: u16,
    /// `zend_execute_data.opline`.
    pub ex_opline: u16,
    /// `zend_execute_data.func`.
    pub ex_func: u16,
    /// `zend_execute_data.This.u1.type_info` (the call info).
    pub ex_call_info: u16,
    /// `zend_execute_data.prev_execute_data`.
    pub ex_prev: u16,
    /// `ZEND_CALL_TOP`.
    pub call_top: u32,
    /// `zend_function.type` (a byte).
    pub fn_type: u16,
    /// `zend_function.common.fn_flags`.
    pub fn_flags: u16,
    /// `zend_function.common.function_name`.
    pub fn_name: u16,
    /// `zend_function.common.scope`.
    pub fn_scope: u16,
    /// `ZEND_ACC_CLOSURE`.
    pub acc_closure: u32,
    /// `zend_op_array.last` (number of opcodes).
    pub op_last: u16,
    /// `zend_op_array.opcodes`.
    pub op_opcodes: u16,
    /// `zend_op_array.filename`.
    pub op_filename: u16,
    /// `zend_op_array.line_start`.
    pub op_line_start: u16,
    /// `sizeof(zend_op)`.
    pub op_size: u16,
    /// `zend_op.lineno`.
    pub op_lineno: u16,
    /// `zend_class_entry.name`.
    pub class_name: u16,
    /// `zend_string.len`.
    pub str_len: u16,
    /// `zend_string.val`.
    pub str_val: u16,
}

/// What every supported version shares: `zend_execute_data`, `zend_op`,
/// `zend_string`, the `zend_function` common head and the class name.
const COMMON: PhpLayout = PhpLayout {
    version: (0, 0),
    eg_current_execute_data: 0,
    ex_opline: 0,
    ex_func: 24,
    ex_call_info: 40,
    ex_prev: 48,
    call_top: 1 << 17,
    fn_type: 0,
    fn_flags: 4,
    fn_name: 8,
    fn_scope: 16,
    acc_closure: 1 << 22,
    op_last: 0,
    op_opcodes: 0,
    op_filename: 0,
    op_line_start: 0,
    op_size: 32,
    op_lineno: 24,
    class_name: 8,
    str_len: 16,
    str_val: 24,
};

/// The layout of PHP `major.minor`, if icecore knows it.
pub fn layout(version: (u8, u8)) -> Option<PhpLayout> {
    LAYOUTS.iter().find(|l| l.version == version).copied()
}

/// The versions icecore walks.
pub const SUPPORTED: &str = "8.0 to 8.5";

const LAYOUTS: [PhpLayout; 6] = [
    PhpLayout {
        version: (8, 0),
        eg_current_execute_data: 488,
        op_last: 68,
        op_opcodes: 72,
        op_filename: 144,
        op_line_start: 152,
        ..COMMON
    },
    PhpLayout {
        version: (8, 1),
        eg_current_execute_data: 488,
        op_last: 68,
        op_opcodes: 72,
        op_filename: 144,
        op_line_start: 152,
        ..COMMON
    },
    PhpLayout {
        version: (8, 2),
        eg_current_execute_data: 488,
        op_last: 80,
        op_opcodes: 88,
        op_filename: 152,
        op_line_start: 160,
        ..COMMON
    },
    PhpLayout {
        version: (8, 3),
        eg_current_execute_data: 488,
        op_last: 76,
        op_opcodes: 80,
        op_filename: 144,
        op_line_start: 152,
        ..COMMON
    },
    PhpLayout {
        version: (8, 4),
        eg_current_execute_data: 488,
        op_last: 96,
        op_opcodes: 104,
        op_filename: 168,
        op_line_start: 176,
        ..COMMON
    },
    PhpLayout {
        version: (8, 5),
        eg_current_execute_data: 512,
        op_last: 96,
        op_opcodes: 104,
        op_filename: 168,
        op_line_start: 176,
        ..COMMON
    },
];
