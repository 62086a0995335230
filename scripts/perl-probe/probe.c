/*
 * probe.c - print struct offsets/sizes and constants needed by a Perl stack
 * unwinder, compiled against the headers of one perl version, and (with
 * --runtime SCRIPT) run an embedded interpreter whose XSUB main::probe_walk
 * walks the context stack using ONLY the raw numbers printed in part 1
 * (reading memory through byte offsets, as an eBPF unwinder would) and
 * prints frames next to Perl's own caller() output.
 *
 * Build (inside the chroot of the perl version to probe):
 *   gcc -O0 -o probe probe.c $(perl -MExtUtils::Embed -e ccopts -e ldopts)
 */
#include <EXTERN.h>
#include <perl.h>
#include <XSUB.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define SZ(name, type)         printf("sizeof.%-40s %zu\n", name, sizeof(type))
#define OFF(name, type, memb)  printf("off.%-44s %4zu size %zu\n", name, \
                                      offsetof(type, memb), sizeof(((type *)0)->memb))
#define VAL(name)              printf("val.%-44s 0x%lx (%ld)\n", #name, \
                                      (unsigned long)(name), (long)(name))

static void layout(void)
{
    printf("hdr.PERL_VERSION_STRING %d.%d.%d\n", PERL_REVISION, PERL_VERSION, PERL_SUBVERSION);
#ifdef USE_ITHREADS
    printf("cfg.USE_ITHREADS 1\n");
#else
    printf("cfg.USE_ITHREADS 0\n");
#endif
#ifdef MULTIPLICITY
    printf("cfg.MULTIPLICITY 1\n");
#else
    printf("cfg.MULTIPLICITY 0\n");
#endif
#ifdef PERL_USE_THREAD_LOCAL
    printf("cfg.PERL_USE_THREAD_LOCAL 1 (PERL_GET_CONTEXT is the TLS var PL_current_context)\n");
#else
    printf("cfg.PERL_USE_THREAD_LOCAL 0\n");
#endif
#ifdef PERL_RC_STACK
    printf("cfg.PERL_RC_STACK 1\n");
#else
    printf("cfg.PERL_RC_STACK 0\n");
#endif
#ifdef PERL_HASH_RANDOMIZE_KEYS
    printf("cfg.PERL_HASH_RANDOMIZE_KEYS 1\n");
#else
    printf("cfg.PERL_HASH_RANDOMIZE_KEYS 0\n");
#endif
#ifdef DEBUGGING
    printf("cfg.DEBUGGING 1\n");
#else
    printf("cfg.DEBUGGING 0\n");
#endif

    /* ---- PerlInterpreter (struct interpreter) ---- */
    SZ("PerlInterpreter", PerlInterpreter);
    OFF("interpreter.Istack_sp",     struct interpreter, Istack_sp);
    OFF("interpreter.Iop",           struct interpreter, Iop);
    OFF("interpreter.Icurpad",       struct interpreter, Icurpad);
    OFF("interpreter.Istack_base",   struct interpreter, Istack_base);
    OFF("interpreter.Idefstash",     struct interpreter, Idefstash);
    OFF("interpreter.Icurstash",     struct interpreter, Icurstash);
    OFF("interpreter.Icurcop",       struct interpreter, Icurcop);
    OFF("interpreter.Icurstack",     struct interpreter, Icurstack);
    OFF("interpreter.Icurstackinfo", struct interpreter, Icurstackinfo);
    OFF("interpreter.Imainstack",    struct interpreter, Imainstack);
    OFF("interpreter.Imain_cv",      struct interpreter, Imain_cv);
    OFF("interpreter.Imain_root",    struct interpreter, Imain_root);
    OFF("interpreter.Imain_start",   struct interpreter, Imain_start);
    OFF("interpreter.Icurcopdb",     struct interpreter, Icurcopdb);
#ifdef USE_ITHREADS
    OFF("interpreter.Istashpad",     struct interpreter, Istashpad);
    OFF("interpreter.Istashpadmax",  struct interpreter, Istashpadmax);
    OFF("interpreter.Istashpadix",   struct interpreter, Istashpadix);
#endif

    /* ---- PERL_SI (struct stackinfo) ---- */
    SZ("PERL_SI", PERL_SI);
    OFF("stackinfo.si_stack",   PERL_SI, si_stack);
    OFF("stackinfo.si_cxstack", PERL_SI, si_cxstack);
    OFF("stackinfo.si_prev",    PERL_SI, si_prev);
    OFF("stackinfo.si_next",    PERL_SI, si_next);
    OFF("stackinfo.si_cxix",    PERL_SI, si_cxix);
    OFF("stackinfo.si_cxmax",   PERL_SI, si_cxmax);
    OFF("stackinfo.si_cxsubix", PERL_SI, si_cxsubix);
    OFF("stackinfo.si_type",    PERL_SI, si_type);
    OFF("stackinfo.si_markoff", PERL_SI, si_markoff);
    VAL(PERLSI_MAIN); VAL(PERLSI_SORT); VAL(PERLSI_SIGNAL); VAL(PERLSI_MAGIC);
    VAL(PERLSI_REQUIRE); VAL(PERLSI_MULTICALL); VAL(PERLSI_DESTROY);

    /* ---- PERL_CONTEXT (struct context) ---- */
    SZ("PERL_CONTEXT", PERL_CONTEXT);
    SZ("struct_block", struct block);
    SZ("struct_subst", struct subst);
    OFF("context.cx_type(cx_u.cx_subst.sbu_type)",   PERL_CONTEXT, cx_u.cx_subst.sbu_type);
    OFF("context.cx_u.cx_blk.blku_type",             PERL_CONTEXT, cx_u.cx_blk.blku_type);
    OFF("context.cx_u.cx_blk.blku_gimme",            PERL_CONTEXT, cx_u.cx_blk.blku_gimme);
    OFF("context.blk_u16(blku_u16)",                 PERL_CONTEXT, cx_u.cx_blk.blku_u16);
    OFF("context.blk_oldsp(blku_oldsp)",             PERL_CONTEXT, cx_u.cx_blk.blku_oldsp);
    OFF("context.blk_oldcop(blku_oldcop)",           PERL_CONTEXT, cx_u.cx_blk.blku_oldcop);
    OFF("context.cx_u.cx_blk.blk_u",                 PERL_CONTEXT, cx_u.cx_blk.blk_u);
    OFF("context.blk_sub.retop",                     PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.retop);
    OFF("context.blk_sub.old_cxsubix",               PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.old_cxsubix);
    OFF("context.blk_sub.prevcomppad",               PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.prevcomppad);
    OFF("context.blk_sub.cv",                        PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.cv);
    OFF("context.blk_sub.olddepth",                  PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.olddepth);
    OFF("context.blk_sub.savearray",                 PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.savearray);
    OFF("context.blk_format.cv",                     PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_format.cv);
    OFF("context.blk_eval.retop",                    PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.retop);
    OFF("context.blk_eval.old_namesv",               PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.old_namesv);
    OFF("context.blk_eval.old_eval_root",            PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.old_eval_root);
    OFF("context.blk_eval.cur_text",                 PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.cur_text);
    OFF("context.blk_eval.cv",                       PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.cv);
    OFF("context.blk_eval.cur_top_env",              PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.cur_top_env);
    VAL(OP_ENTEREVAL); VAL(OP_REQUIRE); VAL(OP_ENTERTRY); VAL(OP_ENTERSUB); VAL(OP_NEXTSTATE); VAL(OP_DBSTATE);
#if PERL_VERSION >= 34
    VAL(OP_ENTERTRYCATCH);
#endif
    VAL(MAXO);
    VAL(CXTYPEMASK);
    VAL(CXt_NULL);
#ifdef CXt_WHEN
    VAL(CXt_WHEN);
#endif
    VAL(CXt_BLOCK);
#ifdef CXt_GIVEN
    VAL(CXt_GIVEN);
#endif
    VAL(CXt_LOOP_ARY); VAL(CXt_LOOP_LAZYSV); VAL(CXt_LOOP_LAZYIV);
    VAL(CXt_LOOP_LIST); VAL(CXt_LOOP_PLAIN);
    VAL(CXt_SUB); VAL(CXt_FORMAT); VAL(CXt_EVAL); VAL(CXt_SUBST);
#ifdef CXt_DEFER
    VAL(CXt_DEFER);
#endif
    VAL(CXp_MULTICALL); VAL(CXp_HASARGS); VAL(CXp_SUB_RE); VAL(CXp_SUB_RE_FAKE);
    VAL(CXp_REAL); VAL(CXp_EVALBLOCK);
#ifdef CXp_TRY
    VAL(CXp_TRY);
#endif
#ifdef CXp_FINALLY
    VAL(CXp_FINALLY);
#endif

    /* ---- OP / COP ---- */
    SZ("OP", OP);
    OFF("op.op_next",      OP, op_next);
    OFF("op.op_sibparent", OP, op_sibparent);
    OFF("op.op_ppaddr",    OP, op_ppaddr);
    OFF("op.op_targ",      OP, op_targ);
    {
        /* op_type is a 9-bit bitfield; find its byte offset at runtime */
        OP o; size_t i; memset(&o, 0, sizeof o); o.op_type = 0x1ff;
        for (i = 0; i < sizeof o; i++) if (((unsigned char *)&o)[i]) break;
        printf("off.%-44s %4zu (bitfield op_type:9, low 9 bits of the U16 at this offset)\n", "op.op_type", i);
    }
    SZ("COP", COP);
    OFF("cop.cop_line",       COP, cop_line);
#ifdef USE_ITHREADS
    OFF("cop.cop_stashoff",   COP, cop_stashoff);
    OFF("cop.cop_file",       COP, cop_file);
#else
    OFF("cop.cop_stash",      COP, cop_stash);
    OFF("cop.cop_filegv",     COP, cop_filegv);
#endif
    OFF("cop.cop_hints",      COP, cop_hints);
    OFF("cop.cop_seq",        COP, cop_seq);
    OFF("cop.cop_warnings",   COP, cop_warnings);
    OFF("cop.cop_hints_hash", COP, cop_hints_hash);
    OFF("cop.cop_features",   COP, cop_features);
#ifdef RCPV_LEN
    SZ("struct_rcpv", struct rcpv);
    OFF("rcpv.refcount", struct rcpv, refcount);
    OFF("rcpv.len(incl NUL)", struct rcpv, len);
    OFF("rcpv.pv",       struct rcpv, pv);
#else
    printf("note.rcpv absent (RCPV_LEN not defined): cop_file is a plain savesharedpv() string\n");
#endif

    /* ---- SV head ---- */
    SZ("SV", SV);
    OFF("sv.sv_any",    SV, sv_any);
    OFF("sv.sv_refcnt", SV, sv_refcnt);
    OFF("sv.sv_flags",  SV, sv_flags);
    OFF("sv.sv_u",      SV, sv_u);
    VAL(SVTYPEMASK);
    VAL(SVt_PVMG); VAL(SVt_PVGV); VAL(SVt_PVLV); VAL(SVt_PVAV); VAL(SVt_PVHV);
    VAL(SVt_PVCV); VAL(SVt_PVFM); VAL(SVt_PVIO);
#if PERL_VERSION >= 38
    VAL(SVt_PVOBJ);
#endif
    VAL(SVt_LAST);
    VAL(SVf_OOK); VAL(SVf_ROK); VAL(SVf_FAKE); VAL(SVphv_HASKFLAGS); VAL(SVphv_SHAREKEYS);
#ifdef SVphv_HasAUX
    VAL(SVphv_HasAUX);
#endif

    /* ---- CV / XPVCV ---- */
    SZ("CV", CV);
    SZ("XPVCV", XPVCV);
    OFF("xpvcv.xmg_stash",      XPVCV, xmg_stash);
    OFF("xpvcv.xpv_cur",        XPVCV, xpv_cur);
    OFF("xpvcv.xcv_stash",      XPVCV, xcv_stash);
    OFF("xpvcv.xcv_start_u",    XPVCV, xcv_start_u);
    OFF("xpvcv.xcv_root_u",     XPVCV, xcv_root_u);
    OFF("xpvcv.xcv_root_u.xcv_xsub", XPVCV, xcv_root_u.xcv_xsub);
    OFF("xpvcv.xcv_gv_u",       XPVCV, xcv_gv_u);
    OFF("xpvcv.xcv_gv_u.xcv_gv",  XPVCV, xcv_gv_u.xcv_gv);
    OFF("xpvcv.xcv_gv_u.xcv_hek", XPVCV, xcv_gv_u.xcv_hek);
    OFF("xpvcv.xcv_file",       XPVCV, xcv_file);
    OFF("xpvcv.xcv_padlist_u",  XPVCV, xcv_padlist_u);
    OFF("xpvcv.xcv_outside",    XPVCV, xcv_outside);
    OFF("xpvcv.xcv_outside_seq", XPVCV, xcv_outside_seq);
    OFF("xpvcv.xcv_flags",      XPVCV, xcv_flags);
    OFF("xpvcv.xcv_depth",      XPVCV, xcv_depth);
    /* every CVf_ flag guarded: CVf_HASEVAL e.g. is absent in 5.40 */
#ifdef CVf_NOWARN_AMBIGUOUS
    VAL(CVf_NOWARN_AMBIGUOUS);
#else
    printf("val.%-44s (not defined)\n", "CVf_NOWARN_AMBIGUOUS");
#endif
#ifdef CVf_METHOD
    VAL(CVf_METHOD);
#else
    printf("val.%-44s (not defined)\n", "CVf_METHOD");
#endif
#ifdef CVf_LVALUE
    VAL(CVf_LVALUE);
#else
    printf("val.%-44s (not defined)\n", "CVf_LVALUE");
#endif
#ifdef CVf_CONST
    VAL(CVf_CONST);
#else
    printf("val.%-44s (not defined)\n", "CVf_CONST");
#endif
#ifdef CVf_ISXSUB
    VAL(CVf_ISXSUB);
#else
    printf("val.%-44s (not defined)\n", "CVf_ISXSUB");
#endif
#ifdef CVf_WEAKOUTSIDE
    VAL(CVf_WEAKOUTSIDE);
#else
    printf("val.%-44s (not defined)\n", "CVf_WEAKOUTSIDE");
#endif
#ifdef CVf_CLONE
    VAL(CVf_CLONE);
#else
    printf("val.%-44s (not defined)\n", "CVf_CLONE");
#endif
#ifdef CVf_CLONED
    VAL(CVf_CLONED);
#else
    printf("val.%-44s (not defined)\n", "CVf_CLONED");
#endif
#ifdef CVf_ANON
    VAL(CVf_ANON);
#else
    printf("val.%-44s (not defined)\n", "CVf_ANON");
#endif
#ifdef CVf_UNIQUE
    VAL(CVf_UNIQUE);
#else
    printf("val.%-44s (not defined)\n", "CVf_UNIQUE");
#endif
#ifdef CVf_NODEBUG
    VAL(CVf_NODEBUG);
#else
    printf("val.%-44s (not defined)\n", "CVf_NODEBUG");
#endif
#ifdef CVf_CVGV_RC
    VAL(CVf_CVGV_RC);
#else
    printf("val.%-44s (not defined)\n", "CVf_CVGV_RC");
#endif
#ifdef CVf_SLABBED
    VAL(CVf_SLABBED);
#else
    printf("val.%-44s (not defined)\n", "CVf_SLABBED");
#endif
#ifdef CVf_DYNFILE
    VAL(CVf_DYNFILE);
#else
    printf("val.%-44s (not defined)\n", "CVf_DYNFILE");
#endif
#ifdef CVf_AUTOLOAD
    VAL(CVf_AUTOLOAD);
#else
    printf("val.%-44s (not defined)\n", "CVf_AUTOLOAD");
#endif
#ifdef CVf_HASEVAL
    VAL(CVf_HASEVAL);
#else
    printf("val.%-44s (not defined)\n", "CVf_HASEVAL");
#endif
#ifdef CVf_NAMED
    VAL(CVf_NAMED);
#else
    printf("val.%-44s (not defined)\n", "CVf_NAMED");
#endif
#ifdef CVf_LEXICAL
    VAL(CVf_LEXICAL);
#else
    printf("val.%-44s (not defined)\n", "CVf_LEXICAL");
#endif
#ifdef CVf_ANONCONST
    VAL(CVf_ANONCONST);
#else
    printf("val.%-44s (not defined)\n", "CVf_ANONCONST");
#endif
#ifdef CVf_SIGNATURE
    VAL(CVf_SIGNATURE);
#else
    printf("val.%-44s (not defined)\n", "CVf_SIGNATURE");
#endif
#ifdef CVf_REFCOUNTED_ANYSV
    VAL(CVf_REFCOUNTED_ANYSV);
#else
    printf("val.%-44s (not defined)\n", "CVf_REFCOUNTED_ANYSV");
#endif
#ifdef CVf_IsMETHOD
    VAL(CVf_IsMETHOD);
#else
    printf("val.%-44s (not defined)\n", "CVf_IsMETHOD");
#endif
#ifdef CVf_XS_RCSTACK
    VAL(CVf_XS_RCSTACK);
#else
    printf("val.%-44s (not defined)\n", "CVf_XS_RCSTACK");
#endif
#ifdef CVf_EVAL_COMPILED
    VAL(CVf_EVAL_COMPILED);
#else
    printf("val.%-44s (not defined)\n", "CVf_EVAL_COMPILED");
#endif

    /* ---- GV / XPVGV / GP ---- */
    SZ("GV", GV);
    SZ("XPVGV", XPVGV);
    OFF("xpvgv.xiv_u.xivu_namehek(GvNAME_HEK)", XPVGV, xiv_u.xivu_namehek);
    OFF("xpvgv.xnv_u.xgv_stash(GvSTASH)",       XPVGV, xnv_u.xgv_stash);
    OFF("gv.sv_u.svu_gp(GvGP)",                 GV, sv_u.svu_gp);
    SZ("GP", GP);
    OFF("gp.gp_sv",       GP, gp_sv);
    OFF("gp.gp_io",       GP, gp_io);
    OFF("gp.gp_cv",       GP, gp_cv);
    OFF("gp.gp_hv",       GP, gp_hv);
    OFF("gp.gp_av",       GP, gp_av);
    OFF("gp.gp_form",     GP, gp_form);
    OFF("gp.gp_egv",      GP, gp_egv);
    OFF("gp.gp_file_hek", GP, gp_file_hek);

    /* ---- HEK ---- */
    SZ("HEK", HEK);
    OFF("hek.hek_hash", HEK, hek_hash);
    OFF("hek.hek_len",  HEK, hek_len);
    OFF("hek.hek_key",  HEK, hek_key);

    /* ---- HV / XPVHV / aux ---- */
    SZ("XPVHV", XPVHV);
    OFF("xpvhv.xhv_keys", XPVHV, xhv_keys);
    OFF("xpvhv.xhv_max",  XPVHV, xhv_max);
    OFF("hv.sv_u.svu_hash(HvARRAY)", HV, sv_u.svu_hash);
    SZ("struct_xpvhv_aux", struct xpvhv_aux);
    SZ("struct_xpvhv_with_aux", struct xpvhv_with_aux);
    OFF("xpvhv_with_aux.xhv_aux", struct xpvhv_with_aux, xhv_aux);
    OFF("xpvhv_aux.xhv_name_u",     struct xpvhv_aux, xhv_name_u);
    OFF("xpvhv_aux.xhv_backreferences", struct xpvhv_aux, xhv_backreferences);
    OFF("xpvhv_aux.xhv_eiter",      struct xpvhv_aux, xhv_eiter);
    OFF("xpvhv_aux.xhv_riter",      struct xpvhv_aux, xhv_riter);
    OFF("xpvhv_aux.xhv_name_count", struct xpvhv_aux, xhv_name_count);
    OFF("xpvhv_aux.xhv_mro_meta",   struct xpvhv_aux, xhv_mro_meta);
    OFF("xpvhv_aux.xhv_aux_flags",  struct xpvhv_aux, xhv_aux_flags);
    printf("off.%-44s %4zu\n", "xpvhv_with_aux.xhv_aux.xhv_name_u(abs)",
           offsetof(struct xpvhv_with_aux, xhv_aux) + offsetof(struct xpvhv_aux, xhv_name_u));
    printf("off.%-44s %4zu\n", "xpvhv_with_aux.xhv_aux.xhv_name_count(abs)",
           offsetof(struct xpvhv_with_aux, xhv_aux) + offsetof(struct xpvhv_aux, xhv_name_count));
}

/* ------------------------------------------------------------------ */
/* Part 2: runtime walk with raw offsets only                           */
/* ------------------------------------------------------------------ */

#define RP(base, off)   (*(void **)((char *)(base) + (off)))
#define RU32(base, off) (*(U32 *)((char *)(base) + (off)))
#define RI32(base, off) (*(I32 *)((char *)(base) + (off)))
#define RU8(base, off)  (*(U8 *)((char *)(base) + (off)))

/* all offsets taken into plain size_t variables, as a BPF program would get them */
static size_t o_curstackinfo, o_curcop, o_stashpad, o_main_cv,
    o_si_cxstack, o_si_cxix, o_si_prev, o_si_type, sz_cx,
    o_cx_type, o_oldcop, o_sub_cv, o_eval_old_namesv, o_eval_cur_text, o_blk_u16,
    o_cop_line, o_cop_file, o_cop_stashoff,
    o_sv_any, o_sv_flags, o_sv_u,
    o_xcv_stash, o_xcv_gv, o_xcv_file, o_xcv_flags, o_xcv_depth,
    o_xgv_namehek, o_xgv_stash, o_hv_aux, o_aux_name, o_aux_name_count,
    o_hek_len, o_hek_key;

static void init_offsets(void)
{
    o_curstackinfo = offsetof(struct interpreter, Icurstackinfo);
    o_curcop = offsetof(struct interpreter, Icurcop);
    o_stashpad = offsetof(struct interpreter, Istashpad);
    o_main_cv = offsetof(struct interpreter, Imain_cv);
    o_si_cxstack = offsetof(PERL_SI, si_cxstack);
    o_si_cxix = offsetof(PERL_SI, si_cxix);
    o_si_prev = offsetof(PERL_SI, si_prev);
    o_si_type = offsetof(PERL_SI, si_type);
    sz_cx = sizeof(PERL_CONTEXT);
    o_cx_type = offsetof(PERL_CONTEXT, cx_u.cx_subst.sbu_type);
    o_oldcop = offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_oldcop);
    o_sub_cv = offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.cv);
    o_eval_old_namesv = offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.old_namesv);
    o_eval_cur_text = offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.cur_text);
    o_blk_u16 = offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_u16);
    o_cop_line = offsetof(COP, cop_line);
    o_cop_file = offsetof(COP, cop_file);
    o_cop_stashoff = offsetof(COP, cop_stashoff);
    o_sv_any = offsetof(SV, sv_any);
    o_sv_flags = offsetof(SV, sv_flags);
    o_sv_u = offsetof(SV, sv_u);
    o_xcv_stash = offsetof(XPVCV, xcv_stash);
    o_xcv_gv = offsetof(XPVCV, xcv_gv_u);
    o_xcv_file = offsetof(XPVCV, xcv_file);
    o_xcv_flags = offsetof(XPVCV, xcv_flags);
    o_xcv_depth = offsetof(XPVCV, xcv_depth);
    o_xgv_namehek = offsetof(XPVGV, xiv_u.xivu_namehek);
    o_xgv_stash = offsetof(XPVGV, xnv_u.xgv_stash);
    o_hv_aux = offsetof(struct xpvhv_with_aux, xhv_aux);
    o_aux_name = offsetof(struct xpvhv_aux, xhv_name_u);
    o_aux_name_count = offsetof(struct xpvhv_aux, xhv_name_count);
    o_hek_len = offsetof(HEK, hek_len);
    o_hek_key = offsetof(HEK, hek_key);
}

/* HvNAME of a stash, raw */
static const char *raw_hvname(void *hv)
{
    void *body, *hek;
    I32 cnt;
    if (!hv) return "(null-stash)";
    if (!(RU32(hv, o_sv_flags) & SVf_OOK)) return "(no-aux)";   /* SVphv_HasAUX == SVf_OOK */
    body = RP(hv, o_sv_any);
    hek = RP(body, o_hv_aux + o_aux_name);
    cnt = RI32(body, o_hv_aux + o_aux_name_count);
    if (!hek) return "(no-name)";
    if (cnt) hek = *(void **)hek;          /* xhvnameu_names[0] */
    if (!hek) return "(null-name)";
    return (char *)hek + o_hek_key;
}

static void raw_cvname(void *cv, char *out, size_t n)
{
    void *body = RP(cv, o_sv_any);
    U32 flags = RU32(body, o_xcv_flags);
    void *u = RP(body, o_xcv_gv);
    const char *pkg, *name;
    if (flags & CVf_NAMED) {                 /* lexical / named-by-HEK sub */
        name = (char *)u + o_hek_key;
        pkg = raw_hvname(RP(body, o_xcv_stash));
    } else if (u) {                          /* u is a GV */
        void *gvbody = RP(u, o_sv_any);
        void *hek = RP(gvbody, o_xgv_namehek);
        name = hek ? (char *)hek + o_hek_key : "(gv-no-name)";
        pkg = raw_hvname(RP(gvbody, o_xgv_stash));
    } else {
        name = "(no-gv)"; pkg = "?";
    }
    snprintf(out, n, "%s::%s [CvFLAGS=0x%x%s%s depth=%d file=%s]", pkg, name, flags,
             (flags & CVf_ANON) ? " ANON" : "", (flags & CVf_NAMED) ? " NAMED" : "",
             RI32(body, o_xcv_depth), (char *)RP(body, o_xcv_file));
}

static void raw_cop(void *my, void *cop, char *out, size_t n)
{
    void **stashpad = RP(my, o_stashpad);
    size_t soff = *(PADOFFSET *)((char *)cop + o_cop_stashoff);
    snprintf(out, n, "%s:%u (CopSTASH=%s)", (char *)RP(cop, o_cop_file),
             RU32(cop, o_cop_line), raw_hvname(stashpad[soff]));
}

XS(xs_walk);
XS(xs_walk)
{
    dXSARGS;
    void *my = (void *)my_perl;
    void *si, *cop;
    char nb[512], cb[512];
    int frame = 0;
    PERL_UNUSED_VAR(items);
    fflush(stdout);
    printf("  walk: my_perl=%p PL_current_context=%p PL_curinterp=%p same=%d\n",
           my, PERL_GET_CONTEXT, (void *)PL_curinterp, my == PERL_GET_CONTEXT);
    si = RP(my, o_curstackinfo);
    cop = RP(my, o_curcop);
    while (si) {
        void *cxs = RP(si, o_si_cxstack);
        I32 ix = RI32(si, o_si_cxix);
        printf("  walk: stackinfo %p si_type=%d si_cxix=%d\n", si, RI32(si, o_si_type), ix);
        for (; ix >= 0; ix--) {
            char *cx = (char *)cxs + (size_t)ix * sz_cx;
            U8 t = RU8(cx, o_cx_type);
            switch (t & CXTYPEMASK) {
            case CXt_SUB: case CXt_FORMAT:
                raw_cvname(RP(cx, o_sub_cv), nb, sizeof nb);
                raw_cop(my, cop, cb, sizeof cb);
                printf("  walk: #%d cx[%d] type=0x%02x %s  %s  at %s\n", frame++, ix, t,
                       (t & CXTYPEMASK) == CXt_SUB ? "SUB" : "FORMAT", nb, cb);
                cop = RP(cx, o_oldcop);
                break;
            case CXt_EVAL: {
                unsigned oldop = *(U16 *)(cx + o_blk_u16) >> 7;   /* CxOLD_OP_TYPE */
                SV *txt = (SV *)RP(cx, o_eval_cur_text);
                SV *nsv = (SV *)RP(cx, o_eval_old_namesv);
                raw_cop(my, cop, cb, sizeof cb);
                printf("  walk: #%d cx[%d] type=0x%02x EVAL%s%s%s old_op=%u(%s) old_namesv=%s text=%s  at %s\n",
                       frame++, ix, t,
                       (t & CXp_REAL) ? " REAL" : "",
                       (t & CXp_EVALBLOCK) ? " EVALBLOCK" : "",
                       ((t & (CXTYPEMASK|CXp_TRY)) == (CXt_EVAL|CXp_TRY)) ? " TRY(caller skips)" : "",
                       oldop, oldop < MAXO ? PL_op_name[oldop] : "?",
                       nsv ? SvPV_nolen(nsv) : "NULL",
                       (oldop == OP_ENTEREVAL && txt) ? SvPV_nolen(txt) : "-", cb);
                cop = RP(cx, o_oldcop);
                break; }
            default:
                printf("  walk:     cx[%d] type=0x%02x (other)\n", ix, t);
            }
        }
        si = RP(si, o_si_prev);
    }
    raw_cop(my, cop, cb, sizeof cb);
    raw_cvname(RP(my, o_main_cv), nb, sizeof nb);
    printf("  walk: #%d main program  PL_main_cv=%s  at %s\n", frame, nb, cb);
    fflush(stdout);
    XSRETURN_EMPTY;
}

static void xs_init(pTHX)
{
    newXS("main::probe_walk", xs_walk, __FILE__);
}

int main(int argc, char **argv, char **env)
{
    if (argc < 3 || strcmp(argv[1], "--runtime") != 0) {
        layout();
        return 0;
    }
    {
        char *args[] = { argv[0], argv[2], NULL };
        PerlInterpreter *my_perl;
        init_offsets();
        PERL_SYS_INIT3(&argc, &argv, &env);
        my_perl = perl_alloc();
        perl_construct(my_perl);
        PL_exit_flags |= PERL_EXIT_DESTRUCT_END;
        perl_parse(my_perl, xs_init, 2, args, NULL);
        perl_run(my_perl);
        perl_destruct(my_perl);
        perl_free(my_perl);
        PERL_SYS_TERM();
    }
    return 0;
}
