//! Perl's struct layouts on x86-64, per version, as data: threaded builds
//! (`useithreads`, as Debian builds every Perl). Printed by a program
//! compiled against each version's own headers (`scripts/perl-probe`,
//! table in `scripts/perl-probe/layouts.md`) for Debian's 5.36.0, 5.40.1,
//! 5.42.3 and 5.44.0, and checked by walking live processes of each
//! (`walk_tests.rs`, in CI). Every field read here sits at the same offset
//! in all four; the interpreter members that moved between 5.36 and 5.40
//! (`Imain_cv`, `Istashpad`) are not read.

/// Where the fields icecore reads sit in one Perl version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerlLayout {
    /// (5, minor).
    pub version: (u8, u8),
    /// `PerlInterpreter.Icurcop`.
    pub interp_curcop: u16,
    /// `PerlInterpreter.Icurstackinfo`.
    pub interp_curstackinfo: u16,
    /// `PERL_SI.si_cxstack`.
    pub si_cxstack: u16,
    /// `PERL_SI.si_prev`.
    pub si_prev: u16,
    /// `PERL_SI.si_cxix`.
    pub si_cxix: u16,
    /// `PERL_SI.si_cxsubix`.
    pub si_cxsubix: u16,
    /// `sizeof(PERL_CONTEXT)`.
    pub context_size: u16,
    /// `PERL_CONTEXT.blk_oldcop`.
    pub cx_oldcop: u16,
    /// `PERL_CONTEXT.blk_sub.cv`.
    pub cx_sub_cv: u16,
    /// `sv.sv_any` (the body).
    pub sv_any: u16,
    /// `sv.sv_flags`.
    pub sv_flags: u16,
    /// `sv.sv_u` (a GV's GP).
    pub sv_u: u16,
    /// `XPVCV.xcv_stash`.
    pub xcv_stash: u16,
    /// `XPVCV.xcv_start_u` (`CvSTART`, the first op run).
    pub xcv_start: u16,
    /// `XPVCV.xcv_gv_u` (the GV, or with `CVf_NAMED` the name's HEK).
    pub xcv_gv: u16,
    /// `XPVCV.xcv_file`.
    pub xcv_file: u16,
    /// `XPVCV.xcv_flags`.
    pub xcv_flags: u16,
    /// `CVf_ISXSUB`.
    pub cvf_isxsub: u32,
    /// `CVf_ANON`.
    pub cvf_anon: u32,
    /// `CVf_NAMED`.
    pub cvf_named: u32,
    /// `CVf_LEXICAL`.
    pub cvf_lexical: u32,
    /// `XPVGV.xiv_u.xivu_namehek`.
    pub xgv_name_hek: u16,
    /// `XPVGV.xnv_u.xgv_stash`.
    pub xgv_stash: u16,
    /// `GP.gp_egv`.
    pub gp_egv: u16,
    /// `HEK.hek_len`.
    pub hek_len: u16,
    /// `HEK.hek_key`.
    pub hek_key: u16,
    /// The `SvFLAGS` bit of a stash with its aux struct (`SVf_OOK`, `SVphv_HasAUX`).
    pub hv_has_aux: u32,
    /// `xpvhv_with_aux.xhv_aux.xhv_name_u`, from the body.
    pub hv_aux_name: u16,
    /// `xpvhv_with_aux.xhv_aux.xhv_name_count`, from the body.
    pub hv_aux_name_count: u16,
    /// `COP.cop_line`.
    pub cop_line: u16,
    /// `COP.cop_file` (a C string in threaded builds).
    pub cop_file: u16,
    /// `OP.op_next`.
    pub op_next: u16,
    /// `OP.op_type` (the low 9 bits of a `u16`).
    pub op_type: u16,
    /// `OP_NEXTSTATE`: a statement's COP (opcode numbers change with
    /// every version).
    pub op_nextstate: u16,
    /// `OP_DBSTATE`: a statement's COP under the debugger.
    pub op_dbstate: u16,
}

/// What every supported version shares (5.36's opcode numbers).
const COMMON: PerlLayout = PerlLayout {
    version: (5, 36),
    interp_curcop: 208,
    interp_curstackinfo: 224,
    si_cxstack: 8,
    si_prev: 16,
    si_cxix: 32,
    si_cxsubix: 40,
    context_size: 104,
    cx_oldcop: 16,
    cx_sub_cv: 72,
    sv_any: 0,
    sv_flags: 12,
    sv_u: 16,
    xcv_stash: 32,
    xcv_start: 40,
    xcv_gv: 56,
    xcv_file: 64,
    xcv_flags: 92,
    cvf_isxsub: 0x8,
    cvf_anon: 0x80,
    cvf_named: 0x8000,
    cvf_lexical: 0x1_0000,
    xgv_name_hek: 32,
    xgv_stash: 40,
    gp_egv: 56,
    hek_len: 4,
    hek_key: 8,
    hv_has_aux: 0x0200_0000,
    hv_aux_name: 32,
    hv_aux_name_count: 60,
    cop_line: 36,
    cop_file: 48,
    op_next: 0,
    op_type: 32,
    op_nextstate: 195,
    op_dbstate: 196,
};

/// Every supported version's layout.
pub const LAYOUTS: [PerlLayout; 4] = [
    PerlLayout {
        version: (5, 36),
        ..COMMON
    },
    PerlLayout {
        version: (5, 40),
        op_nextstate: 198,
        op_dbstate: 199,
        ..COMMON
    },
    PerlLayout {
        version: (5, 42),
        op_nextstate: 202,
        op_dbstate: 203,
        ..COMMON
    },
    PerlLayout {
        version: (5, 44),
        op_nextstate: 202,
        op_dbstate: 203,
        ..COMMON
    },
];

/// The versions supported, for messages.
pub const SUPPORTED: &str = "5.36, 5.40, 5.42 and 5.44";

/// The layout of `version`, if supported.
pub fn layout(version: (u8, u8)) -> Option<PerlLayout> {
    LAYOUTS.iter().find(|l| l.version == version).copied()
}

impl PerlLayout {
    /// What BPF needs of this layout; the caller sets where the
    /// interpreter is found.
    pub fn bpf_process(&self) -> icecore_unwinders::perl::PerlProcess {
        icecore_unwinders::perl::PerlProcess {
            interp_curcop: self.interp_curcop,
            interp_curstackinfo: self.interp_curstackinfo,
            si_cxstack: self.si_cxstack,
            si_prev: self.si_prev,
            si_cxix: self.si_cxix,
            si_cxsubix: self.si_cxsubix,
            context_size: self.context_size,
            cx_oldcop: self.cx_oldcop,
            cx_sub_cv: self.cx_sub_cv,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use icecore_unwinders::perl::CONTEXT_READ_BYTES;

    #[test]
    fn the_context_fields_bpf_reads_lie_in_its_one_read() {
        for l in LAYOUTS {
            for offset in [l.cx_oldcop, l.cx_sub_cv] {
                assert_eq!(offset % 8, 0, "{:?}", l.version);
                assert!(offset < CONTEXT_READ_BYTES, "{:?}", l.version);
            }
        }
    }

    #[test]
    fn only_the_probed_versions_are_supported() {
        assert!(layout((5, 36)).is_some());
        assert!(layout((5, 44)).is_some());
        // 5.38 was never probed; 5.34 keeps a stash's aux after its buckets.
        assert_eq!(layout((5, 38)), None);
        assert_eq!(layout((5, 34)), None);
    }
}
