//! Reading `.eh_frame`/`.debug_frame` with gimli and assembling the table.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::vec::Vec;

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    FrameDescriptionEntry, LittleEndian, RegisterRule, UnwindContext, UnwindOffset, UnwindSection,
    UnwindTableRow, X86_64,
};
use object::{Architecture, CompressionFormat, Object, ObjectSection};

use super::{TableError, TableStats, UnwindTable, plt};
use crate::native::dwarf::{CfaRule, MAX_TABLE_ROWS, RbpRule, UnwindRow, signal_frame};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// A row meaning "fall back to frame pointers".
pub(super) const NO_INFO: UnwindRow = UnwindRow::new(0, CfaRule::NoInfo, 0, RbpRule::Unchanged, 0);
/// A row whose rule cannot be expressed.
const UNSUPPORTED: UnwindRow = UnwindRow::new(0, CfaRule::Unsupported, 0, RbpRule::Unchanged, 0);

/// Where a segment's rows come from, in the order overlaps are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    DebugFrame,
    EhFrame,
    Plt,
}

/// The rows of one FDE or synthesized PLT section, before overlaps are
/// resolved: 24 bytes (a library has hundreds of thousands of FDEs).
struct Segment {
    start: u64,
    end: u64,
    /// Its rows: `rows[first..first + count]` of the collector (both fit
    /// `u32`: a table has at most [`MAX_TABLE_ROWS`] rows).
    first: u32,
    count: u32,
}

impl Segment {
    fn rows(&self) -> Range<usize> {
        self.first as usize..self.first as usize + self.count as usize
    }
}

/// Rows of all segments, each segment's rows sorted and merged.
#[derive(Default)]
pub(super) struct Collector {
    rows: Vec<UnwindRow>,
    segments: Vec<Segment>,
    /// Index of the first `.eh_frame` and the first PLT segment (sources
    /// come in this order: `.debug_frame`, `.eh_frame`, PLT).
    eh_frame_from: Option<usize>,
    plt_from: Option<usize>,
}

/// Whether two rows unwind identically (everything but `pc` equal).
fn same_rules(a: &UnwindRow, b: &UnwindRow) -> bool {
    a.rules == b.rules && a.rbp_offset == b.rbp_offset && a.cfa_offset == b.cfa_offset
}

impl Collector {
    /// Starts a segment; pass the result to [`Collector::push`] and [`Collector::finish`].
    pub(super) fn begin(&self) -> usize {
        self.rows.len()
    }

    /// Adds `rule` from `pc` on to the segment begun at `first`. Rows must come
    /// in address order; one at the same `pc` as the last replaces it, one
    /// before it or with its rules is dropped.
    pub(super) fn push(
        &mut self,
        first: usize,
        pc: u64,
        rule: UnwindRow,
    ) -> Result<(), TableError> {
        let pc = u32::try_from(pc).map_err(|_| TableError::AddressTooLarge(pc))?;
        let row = UnwindRow { pc, ..rule };
        if self.rows.len() > first
            && let Some(last) = self.rows.last_mut()
        {
            if last.pc == pc {
                *last = row;
                return Ok(());
            }
            if last.pc > pc {
                // Out of order (gimli never yields this): keep the table sorted.
                return Ok(());
            }
            if same_rules(last, &row) {
                return Ok(());
            }
        }
        if self.rows.len() >= MAX_TABLE_ROWS as usize {
            return Err(TableError::TooManyRows);
        }
        self.rows.push(row);
        Ok(())
    }

    /// Ends the segment begun at `first`, covering `start..end`.
    pub(super) fn finish(&mut self, first: usize, start: u64, end: u64, source: Source) {
        if first < self.rows.len() && start < end {
            let from = match source {
                Source::DebugFrame => None,
                Source::EhFrame => Some(&mut self.eh_frame_from),
                Source::Plt => Some(&mut self.plt_from),
            };
            if let Some(from) = from {
                from.get_or_insert(self.segments.len());
            }
            // `push` keeps the row count within MAX_TABLE_ROWS (< 2^32).
            self.segments.push(Segment {
                start,
                end,
                first: first as u32,
                count: (self.rows.len() - first) as u32,
            });
        } else {
            self.rows.truncate(first);
        }
    }

    fn source(&self, index: usize) -> Source {
        if self.plt_from.is_some_and(|from| index >= from) {
            Source::Plt
        } else if self.eh_frame_from.is_some_and(|from| index >= from) {
            Source::EhFrame
        } else {
            Source::DebugFrame
        }
    }

    /// Resolves overlaps (earlier segments win), ends segments with `NoInfo`
    /// rows where the next does not follow directly, and merges equal rules,
    /// handing the table's rows to `sink` in address order: the table is
    /// never held here, so a caller can store it compactly as it comes.
    fn assemble(
        self,
        stats: &mut TableStats,
        mut sink: impl FnMut(UnwindRow),
    ) -> Result<(), TableError> {
        // start -> segment index; the taken segments never overlap.
        let mut taken: BTreeMap<u64, u32> = BTreeMap::new();
        for (index, segment) in self.segments.iter().enumerate() {
            let overlaps = taken
                .range(..segment.end)
                .next_back()
                .is_some_and(|(_, &taken)| self.segments[taken as usize].end > segment.start);
            let plt = self.source(index) == Source::Plt;
            if overlaps {
                if !plt {
                    stats.overlapping_fdes += 1;
                }
                continue;
            }
            if plt {
                stats.synthesized_plt_sections += 1;
            }
            // Fits: at most one segment per row.
            taken.insert(segment.start, index as u32);
        }
        // The last row is held back: a row at the same pc replaces it.
        let mut pending: Option<UnwindRow> = None;
        let mut accepted = 0usize;
        let mut unsupported = 0usize;
        let mut push = |row: UnwindRow| -> Result<(), TableError> {
            match pending {
                Some(ref mut last) if last.pc == row.pc => *last = row,
                Some(ref last) if same_rules(last, &row) => {}
                _ if accepted >= MAX_TABLE_ROWS as usize => return Err(TableError::TooManyRows),
                _ => {
                    if let Some(done) = pending.replace(row) {
                        unsupported += usize::from(done.cfa_rule() == CfaRule::Unsupported);
                        sink(done);
                    }
                    accepted += 1;
                }
            }
            Ok(())
        };
        let mut segments = taken
            .values()
            .map(|&i| &self.segments[i as usize])
            .peekable();
        while let Some(segment) = segments.next() {
            let rows = self.rows.get(segment.rows()).unwrap_or(&[]);
            for row in rows {
                push(*row)?;
            }
            let end = segment.end;
            if segments.peek().is_some_and(|next| next.start == end) || end == 1 << 32 {
                continue;
            }
            let pc = u32::try_from(end).map_err(|_| TableError::AddressTooLarge(end))?;
            push(UnwindRow { pc, ..NO_INFO })?;
        }
        if let Some(done) = pending {
            unsupported += usize::from(done.cfa_rule() == CfaRule::Unsupported);
            sink(done);
        }
        stats.unsupported_rows = unsupported;
        Ok(())
    }
}

/// A file's CFI evaluated into per-FDE rows, before overlaps are resolved.
/// It holds nothing of the file, so the file's bytes can be dropped before
/// [`CollectedCfi::assemble`] streams out the table.
pub struct CollectedCfi {
    collector: Collector,
    stats: TableStats,
}

impl CollectedCfi {
    /// Evaluates the CFI of an ELF file (see the module documentation).
    pub fn from_elf_reader<'data, R: object::ReadRef<'data>>(data: R) -> Result<Self, TableError> {
        collect_elf(data)
    }

    /// At least as many rows as the table will have.
    pub fn max_rows(&self) -> usize {
        self.collector.rows.len() + self.collector.segments.len()
    }

    /// The collected rows (unsorted, unmerged), e.g. to count rules.
    pub fn collected_rows(&self) -> &[UnwindRow] {
        &self.collector.rows
    }

    /// Resolves overlaps and streams the table's rows, in address order, to
    /// `sink`; returns what went into the table.
    pub fn assemble(self, sink: impl FnMut(UnwindRow)) -> Result<TableStats, TableError> {
        let CollectedCfi {
            collector,
            mut stats,
        } = self;
        collector.assemble(&mut stats, sink)?;
        Ok(stats)
    }
}

/// Builds the table of an ELF file (see the module documentation). `data`
/// is the file in memory, or a `ReadCache` over it that reads only the
/// sections used.
pub(super) fn build<'data, R: object::ReadRef<'data>>(data: R) -> Result<UnwindTable, TableError> {
    let collected = collect_elf(data)?;
    let mut rows = Vec::with_capacity(collected.max_rows().min(MAX_TABLE_ROWS as usize));
    let stats = collected.assemble(|row| rows.push(row))?;
    rows.shrink_to_fit();
    Ok(UnwindTable::new(rows, stats))
}

fn collect_elf<'data, R: object::ReadRef<'data>>(data: R) -> Result<CollectedCfi, TableError> {
    let file = object::File::parse(data)?;
    if file.architecture() != Architecture::X86_64 {
        return Err(TableError::UnsupportedArchitecture);
    }
    let mut stats = TableStats::default();
    let mut collector = Collector::default();

    if let Some(section) = file.section_by_name(".debug_frame") {
        if section.compressed_file_range()?.format != CompressionFormat::None {
            stats.debug_frame_compressed = true;
        } else {
            let bytes = section.data()?;
            stats.debug_frame_bytes = bytes.len();
            let mut debug_frame = DebugFrame::new(bytes, LittleEndian);
            debug_frame.set_address_size(8);
            let bases = BaseAddresses::default();
            stats.debug_frame_fdes = collect(
                &debug_frame,
                &bases,
                Source::DebugFrame,
                &mut collector,
                &mut stats.malformed_fdes,
            )?;
        }
    }
    if let Some(section) = file.section_by_name(".eh_frame") {
        let bytes = section.data()?;
        stats.eh_frame_bytes = bytes.len();
        let mut eh_frame = EhFrame::new(bytes, LittleEndian);
        eh_frame.set_address_size(8);
        let address_of = |name| file.section_by_name(name).map(|s| s.address());
        let mut bases = BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = address_of(".text") {
            bases = bases.set_text(text);
        }
        if let Some(got) = address_of(".got") {
            bases = bases.set_got(got);
        }
        stats.eh_frame_fdes = collect(
            &eh_frame,
            &bases,
            Source::EhFrame,
            &mut collector,
            &mut stats.malformed_fdes,
        )?;
    }
    plt::synthesize(&file, &mut collector)?;
    Ok(CollectedCfi { collector, stats })
}

/// Adds a segment per FDE of `section`; returns the number of FDEs.
fn collect<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    source: Source,
    collector: &mut Collector,
    malformed_fdes: &mut usize,
) -> Result<usize, TableError>
where
    S: UnwindSection<Slice<'a>>,
{
    let name = match source {
        Source::DebugFrame => ".debug_frame",
        _ => ".eh_frame",
    };
    let malformed = |error| TableError::Cfi {
        section: name,
        error,
    };
    let mut context = UnwindContext::new();
    let mut cies: HashMap<usize, CommonInformationEntry<Slice<'a>>> = HashMap::new();
    let mut entries = section.entries(bases);
    let mut fdes = 0;
    while let Some(entry) = entries.next().map_err(malformed)? {
        let partial = match entry {
            CieOrFde::Cie(cie) => {
                cies.insert(cie.offset(), cie);
                continue;
            }
            CieOrFde::Fde(partial) => partial,
        };
        // An FDE whose CIE cannot be read describes nothing usable; the
        // entries around it still can be.
        let Ok(fde) = partial.parse(|section, bases, offset| {
            let key = UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        }) else {
            *malformed_fdes += 1;
            continue;
        };
        fdes += 1;
        if !fde_rows(section, bases, &fde, &mut context, source, collector)? {
            *malformed_fdes += 1;
        }
    }
    Ok(fdes)
}

/// Adds the segment of one FDE. Returns `false` when its instructions are
/// malformed: from the failing instruction on, its rows are `Unsupported`
/// (gimli refuses, e.g., `DW_CFA_def_cfa_offset` after a CFA expression,
/// which libgcrypt's hand-written assembly has).
fn fde_rows<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    fde: &FrameDescriptionEntry<Slice<'a>>,
    context: &mut UnwindContext<usize>,
    source: Source,
    collector: &mut Collector,
) -> Result<bool, TableError>
where
    S: UnwindSection<Slice<'a>>,
{
    let start = fde.initial_address();
    let Some(end) = start.checked_add(fde.len()) else {
        // A range wrapping around the address space describes no code.
        return Ok(false);
    };
    if start == end {
        return Ok(true);
    }
    let ra_column = fde.cie().return_address_register() == X86_64::RA;
    let first = collector.begin();
    // Where the row being evaluated starts.
    let mut resume = start;
    let mut well_formed = true;
    match fde.rows(section, bases, context) {
        Ok(mut table) => loop {
            let row = match table.next_row() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(_) => {
                    well_formed = false;
                    if resume < end {
                        collector.push(first, resume, UNSUPPORTED)?;
                    }
                    break;
                }
            };
            let row_start = row.start_address();
            let row_end = row.end_address().min(end);
            resume = resume.max(row_end);
            if row_start >= row_end {
                continue;
            }
            match convert(row, section, ra_column) {
                Converted::Row(rule) => collector.push(first, row_start, rule)?,
                Converted::PltExpression {
                    threshold,
                    template,
                } => plt::expand(collector, first, row_start..row_end, threshold, template)?,
            }
        },
        Err(_) => {
            well_formed = false;
            collector.push(first, start, UNSUPPORTED)?;
        }
    }
    collector.finish(first, start, end, source);
    Ok(well_formed)
}

/// A CFI row as the table can express it.
enum Converted {
    /// An ordinary row (`pc` still to be set).
    Row(UnwindRow),
    /// CFA = rsp + 8, plus 8 where `(rip & 15) >= threshold`; `template`
    /// carries the rbp rule.
    PltExpression { threshold: u8, template: UnwindRow },
}

/// Translates one gimli row into the table's rules.
fn convert<'a, S>(row: &UnwindTableRow<usize>, section: &S, ra_column: bool) -> Converted
where
    S: UnwindSection<Slice<'a>>,
{
    if !ra_column {
        return Converted::Row(UNSUPPORTED);
    }
    if is_signal_frame(row, section) {
        return Converted::Row(UnwindRow::new(
            0,
            CfaRule::SignalFrame,
            0,
            RbpRule::Unchanged,
            0,
        ));
    }
    match row.register(X86_64::RA) {
        Some(RegisterRule::Undefined) => {
            return Converted::Row(UnwindRow::new(
                0,
                CfaRule::EndOfStack,
                0,
                RbpRule::Unchanged,
                0,
            ));
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => return Converted::Row(UNSUPPORTED),
    }
    let (rbp_rule, rbp_offset) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => (RbpRule::Unchanged, 0),
        Some(RegisterRule::Register(register)) if register == X86_64::RBP => {
            (RbpRule::Unchanged, 0)
        }
        Some(RegisterRule::Offset(offset)) if offset % 8 == 0 => match i8::try_from(offset / 8) {
            Ok(words) => (RbpRule::CfaOffset, words),
            Err(_) => return Converted::Row(UNSUPPORTED),
        },
        Some(_) => return Converted::Row(UNSUPPORTED),
    };
    match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            let cfa = match *register {
                X86_64::RSP => CfaRule::Rsp,
                X86_64::RBP => CfaRule::Rbp,
                _ => return Converted::Row(UNSUPPORTED),
            };
            match u16::try_from(*offset) {
                Ok(offset) => Converted::Row(UnwindRow::new(0, cfa, offset, rbp_rule, rbp_offset)),
                Err(_) => Converted::Row(UNSUPPORTED),
            }
        }
        gimli::CfaRule::Expression(expression) => {
            let threshold = expression
                .get(section)
                .ok()
                .and_then(|e| plt::expression_threshold(e.0.slice()));
            if let Some(threshold) = threshold {
                return Converted::PltExpression {
                    threshold,
                    template: UnwindRow::new(0, CfaRule::Rsp, 8, rbp_rule, rbp_offset),
                };
            }
            let deref = expression
                .get(section)
                .ok()
                .and_then(|e| deref_expression(e.0.slice()))
                .and_then(|(register, offset, addend)| {
                    let base = match register {
                        X86_64::RSP => CfaRule::RspDeref,
                        X86_64::RBP => CfaRule::RbpDeref,
                        _ => return None,
                    };
                    UnwindRow::deref(0, base, offset, addend, rbp_rule, rbp_offset)
                });
            Converted::Row(deref.unwrap_or(UNSUPPORTED))
        }
    }
}

/// `DW_OP_breg<r> offset; DW_OP_deref[; DW_OP_plus_uconst addend]`: the CFA
/// is a value saved in the frame (OpenSSL's assembly, GCC's stack
/// realignment, the signal trampoline). Returns (r, offset, addend).
fn deref_expression(expression: &[u8]) -> Option<(gimli::Register, i64, u64)> {
    const DEREF: u8 = gimli::constants::DW_OP_deref.0;
    const PLUS_UCONST: u8 = gimli::constants::DW_OP_plus_uconst.0;
    let mut input = Slice::new(expression, LittleEndian);
    let (register, offset) = breg(&mut input)?;
    if gimli::Reader::read_u8(&mut input).ok()? != DEREF {
        return None;
    }
    let addend = if gimli::Reader::is_empty(&input) {
        0
    } else {
        if gimli::Reader::read_u8(&mut input).ok()? != PLUS_UCONST {
            return None;
        }
        gimli::Reader::read_uleb128(&mut input).ok()?
    };
    gimli::Reader::is_empty(&input).then_some((register, offset, addend))
}

/// `DW_OP_breg<r> offset` at the start of `input`: (r, offset).
fn breg(input: &mut Slice<'_>) -> Option<(gimli::Register, i64)> {
    let op = gimli::Reader::read_u8(input).ok()?;
    let register = op.checked_sub(gimli::constants::DW_OP_breg0.0)?;
    if register > 31 {
        return None;
    }
    let offset = gimli::Reader::read_sleb128(input).ok()?;
    Some((gimli::Register(u16::from(register)), offset))
}

/// A register rule `DW_CFA_expression: DW_OP_breg7 (rsp) offset`: the value
/// is saved at rsp + offset.
fn saved_at_rsp<'a, S: UnwindSection<Slice<'a>>>(
    rule: Option<RegisterRule<usize>>,
    section: &S,
) -> Option<i64> {
    let Some(RegisterRule::Expression(expression)) = rule else {
        return None;
    };
    let expression = expression.get(section).ok()?;
    let mut input = expression.0;
    let (register, offset) = breg(&mut input)?;
    (register == X86_64::RSP && gimli::Reader::is_empty(&input)).then_some(offset)
}

/// The kernel's signal frame, as glibc's `__restore_rt` describes it: the
/// CFA is the saved rsp, rip and rbp are saved in the `ucontext` at rsp, at
/// the offsets the step reads ([`signal_frame`]).
fn is_signal_frame<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
) -> bool {
    let gimli::CfaRule::Expression(cfa) = row.cfa() else {
        return false;
    };
    let cfa = cfa
        .get(section)
        .ok()
        .and_then(|e| deref_expression(e.0.slice()));
    cfa == Some((X86_64::RSP, signal_frame::RSP as i64, 0))
        && saved_at_rsp(row.register(X86_64::RA), section) == Some(signal_frame::RIP as i64)
        && saved_at_rsp(row.register(X86_64::RBP), section) == Some(signal_frame::RBP as i64)
}
