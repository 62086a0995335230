//! CRuby's struct layouts on x86-64, per minor version, as data. Patch
//! releases of one minor move none of these fields. Sources: CRuby's
//! headers of each version, checked against Debian's libruby 3.1.2, 3.3.8
//! and 3.4.11 by reading live processes (`walk_tests.rs` does so in CI).

use icecore_unwinders::ruby::PTHREAD_IN_THREAD;

/// Where the fields icecore reads sit in one CRuby minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RubyLayout {
    /// (major, minor).
    pub version: (u8, u8),
    /// `sizeof(rb_control_frame_t)`.
    pub control_frame_size: u16,
    /// `rb_ractor_t.threads.running_ec`.
    pub ractor_running_ec: u16,
    /// `rb_execution_context_t.thread_ptr`.
    pub ec_thread_ptr: u16,
    /// `rb_thread_t.thread_id` (a `pthread_t`, 3.1) or `rb_thread_t.nt`.
    pub thread_pthread: u16,
    /// `rb_native_thread.thread_id`, or [`PTHREAD_IN_THREAD`] (3.1).
    pub native_thread_pthread: u16,
    /// `rb_iseq_t.body`.
    pub iseq_body: u64,
    /// `rb_iseq_constant_body.location.pathobj`.
    pub body_pathobj: u64,
    /// `rb_iseq_constant_body.location.label`.
    pub body_label: u64,
    /// `rb_iseq_constant_body.location.first_lineno`.
    pub body_first_lineno: u64,
    /// Whether `first_lineno` is a tagged Integer (3.1) rather than an int.
    pub first_lineno_is_value: bool,
    /// `rb_iseq_constant_body.iseq_encoded`.
    pub body_iseq_encoded: u64,
    /// `rb_iseq_constant_body.iseq_size` (u32, in words).
    pub body_iseq_size: u64,
    /// `rb_iseq_constant_body.insns_info.body`.
    pub body_insns_info: u64,
    /// `rb_iseq_constant_body.insns_info.size` (u32).
    pub body_insns_info_size: u64,
    /// `rb_iseq_constant_body.insns_info.succ_index_table`.
    pub body_succ_index_table: u64,
    /// Where an embedded String's bytes start.
    pub string_embedded_bytes: u64,
    /// Whether an embedded String's length is in its flags (3.1) rather
    /// than in the word at +16.
    pub string_embedded_len_in_flags: bool,
    /// `rb_iseq_constant_body.local_iseq`: a block's method.
    pub body_local_iseq: u64,
    /// `tLAST_OP_ID`: IDs up to it are operators, numbered by themselves;
    /// above it an ID's serial is the ID shifted right by 4.
    pub last_op_id: u64,
    /// `FL_SINGLETON`.
    pub singleton_flag: u64,
    /// Where a class keeps its name and a singleton class its object.
    pub class_names: ClassNames,
}

/// Where a class keeps its name (`Foo::Bar`) and a singleton class the
/// object it is the singleton of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassNames {
    /// 3.1: the `__classpath__` and `__attached__` instance variables, in
    /// the `st_table` at `RClass.ptr->iv_tbl`.
    IvarTable {
        /// `RClass.ptr`.
        ext: u64,
        /// `rb_classext_t.iv_tbl`.
        iv_tbl: u64,
    },
    /// 3.3+: fields of the class's embedded `rb_classext_t`.
    Fields {
        /// `classpath`, from the class.
        classpath: u64,
        /// `as.singleton_class.attached_object`, from the class.
        attached_object: u64,
    },
    /// 3.2 keeps them in a shape-indexed ivar array icecore does not read:
    /// methods go without their class.
    Unknown,
}

/// The layout of CRuby `major.minor`, if icecore knows it.
pub fn layout(version: (u8, u8)) -> Option<RubyLayout> {
    LAYOUTS.iter().find(|l| l.version == version).copied()
}

/// The versions icecore walks.
pub const SUPPORTED: &str = "3.1 to 3.4";

const V3_1: RubyLayout = RubyLayout {
    version: (3, 1),
    control_frame_size: 64,
    ractor_running_ec: 0x208,
    ec_thread_ptr: 48,
    thread_pthread: 80,
    native_thread_pthread: PTHREAD_IN_THREAD,
    iseq_body: 16,
    body_pathobj: 64,
    body_label: 80,
    body_first_lineno: 88,
    first_lineno_is_value: true,
    body_iseq_encoded: 8,
    body_iseq_size: 4,
    body_insns_info: 120,
    body_insns_info_size: 136,
    body_succ_index_table: 144,
    string_embedded_bytes: 16,
    string_embedded_len_in_flags: true,
    body_local_iseq: 176,
    last_op_id: 169,
    singleton_flag: 0x1000,
    class_names: ClassNames::IvarTable { ext: 24, iv_tbl: 8 },
};

/// 3.2: `first_lineno` became an int, so `insns_info` moved by 8; Strings
/// always keep their length at +16 and embedded bytes at +24; a thread's
/// `pthread_t` moved to its native thread (`rb_native_thread`).
const V3_2: RubyLayout = RubyLayout {
    version: (3, 2),
    thread_pthread: 40,
    native_thread_pthread: 8,
    first_lineno_is_value: false,
    body_insns_info: 112,
    body_insns_info_size: 128,
    body_succ_index_table: 136,
    string_embedded_bytes: 24,
    string_embedded_len_in_flags: false,
    body_local_iseq: 168,
    class_names: ClassNames::Unknown,
    ..V3_1
};

/// 3.3: `rb_control_frame_t` lost `__bp__`; the ractor's thread scheduler
/// shrank; `rb_native_thread` starts with a serial and its VM.
const V3_3: RubyLayout = RubyLayout {
    version: (3, 3),
    control_frame_size: 56,
    ractor_running_ec: 0x180,
    native_thread_pthread: 16,
    class_names: ClassNames::Fields {
        classpath: 152,
        attached_object: 128,
    },
    ..V3_2
};

/// 3.4: a new operator ID, and `FL_SINGLETON` moved to `FL_USER1`.
const V3_4: RubyLayout = RubyLayout {
    version: (3, 4),
    last_op_id: 170,
    singleton_flag: 0x2000,
    ..V3_3
};

const LAYOUTS: [RubyLayout; 4] = [V3_1, V3_2, V3_3, V3_4];

/// `RString`/`RArray` flag bits, the same in every supported version.
pub mod flags {
    /// `RBasic.flags` type bits.
    pub const TYPE_MASK: u64 = 0x1f;
    /// `T_STRING`.
    pub const T_STRING: u64 = 0x05;
    /// `T_ARRAY`.
    pub const T_ARRAY: u64 = 0x07;
    /// `T_CLASS`.
    pub const T_CLASS: u64 = 0x02;
    /// `T_MODULE`.
    pub const T_MODULE: u64 = 0x03;
    /// `T_IMEMO`.
    pub const T_IMEMO: u64 = 0x1a;
    /// An imemo's kind: `(flags >> 12) & 0xf`.
    pub const IMEMO_KIND_SHIFT: u32 = 12;
    /// `imemo_ment`: a method entry.
    pub const IMEMO_METHOD_ENTRY: u64 = 6;
    /// `RSTRING_NOEMBED` (`FL_USER1`): the bytes are on the heap.
    pub const STRING_NOEMBED: u64 = 0x2000;
    /// 3.1's embedded length: `FL_USER2..6`.
    pub const STRING_EMBED_LEN_MASK_3_1: u64 = 0x7c000;
    /// Its shift.
    pub const STRING_EMBED_LEN_SHIFT_3_1: u32 = 14;
    /// `RARRAY_EMBED_FLAG` (`FL_USER1`).
    pub const ARRAY_EMBED: u64 = 0x2000;
}

/// `RString.as.heap.ptr`, and a heap String's length at +16, in every version.
pub const STRING_HEAP_PTR: u64 = 24;
/// A heap String's length (and from 3.2 any String's).
pub const STRING_LEN: u64 = 16;
/// `RArray` flags: an embedded Array's length (`FL_USER3..9`).
pub const ARRAY_EMBED_LEN_SHIFT: u32 = 15;
/// Its mask, after the shift.
pub const ARRAY_EMBED_LEN_MASK: u64 = 0x7f;
/// A heap Array's length.
pub const ARRAY_HEAP_LEN: u64 = 16;
/// An embedded Array's first element.
pub const ARRAY_EMBEDDED: u64 = 16;
/// A heap Array's element pointer.
pub const ARRAY_HEAP_PTR: u64 = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_has_one_layout_and_the_breaks_are_where_cruby_made_them() {
        for minor in 1..=4 {
            assert_eq!(layout((3, minor)).map(|l| l.version), Some((3, minor)));
        }
        assert_eq!(layout((3, 0)), None);
        assert_eq!(layout((3, 5)), None);
        assert_eq!(V3_1.control_frame_size, V3_2.control_frame_size);
        assert_eq!(V3_3.control_frame_size, 56);
        assert_eq!(V3_1.body_insns_info - V3_2.body_insns_info, 8);
        assert_eq!(V3_3.body_insns_info, V3_4.body_insns_info);
    }
}
