//! Naming a `Method*` read from the JVM: its class (`java.lang.String`),
//! name, signature and source file through its constant pool, and the line
//! of a bytecode index from its compressed line-number table.

use super::{
    compressed::{line_of, line_table},
    layout::{HotSpotLayout, SourceFileIndex},
};
use crate::runtimes::memory::ProcessMemory;

/// Longest symbol read (class names of generated classes can be long).
const MAX_SYMBOL: u64 = 4096;
/// Largest line-number table read (a longer one is cut at this).
const MAX_LINE_TABLE: u64 = 4096;
/// `ConstMethod` flags: the method has a line-number table.
const HAS_LINE_NUMBER_TABLE: u8 = 0x1;

/// A Java method, as its class file names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JavaMethod {
    /// `java.lang.String` (dots; nested classes keep their `$`).
    pub class: String,
    /// `hashCode`, `<init>`, `lambda$main$0`.
    pub name: String,
    /// `()I`.
    pub signature: String,
    /// `String.java`; `None` for generated classes without one.
    pub source_file: Option<String>,
    /// (bytecode index, line) pairs.
    pub lines: Vec<(u32, u32)>,
    /// Where its bytecodes start (right after its `ConstMethod`): an
    /// interpreted frame's bytecode pointer minus this is its bci. Kept
    /// with the name, so that samples symbolized after the JVM exited keep
    /// their lines.
    pub bytecodes: u64,
    /// Its bytecodes' length.
    pub code_size: u16,
}

impl JavaMethod {
    /// `java.lang.String.hashCode`, as stack traces show it.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.class, self.name)
    }

    /// The line of bytecode index `bci` (a bci of -1, an inlined method's
    /// entry, counts as 0); 0 when unknown.
    pub fn line(&self, bci: i32) -> u32 {
        line_of(&self.lines, u32::try_from(bci.max(0)).unwrap_or(0))
    }

    /// The bytecode index an interpreted frame's bytecode pointer `bcp`
    /// stands for: 0 when it is not inside this method's bytecodes.
    pub fn bci_of(&self, bcp: u64) -> i32 {
        bcp.checked_sub(self.bytecodes)
            .filter(|&b| b < u64::from(self.code_size))
            .map_or(0, |b| b as i32)
    }
}

/// Reads methods of one JVM.
pub struct Methods<'a> {
    memory: &'a ProcessMemory,
    layout: HotSpotLayout,
}

impl<'a> Methods<'a> {
    /// Methods of the JVM behind `memory`.
    pub fn new(memory: &'a ProcessMemory, layout: HotSpotLayout) -> Self {
        Methods { memory, layout }
    }

    fn u16_at(&self, at: u64) -> Option<u16> {
        let mut b = [0u8; 2];
        self.memory.read_exact(at, &mut b).ok()?;
        Some(u16::from_le_bytes(b))
    }

    /// The `Symbol` at `symbol` as text (modified UTF-8, read as UTF-8).
    pub fn symbol(&self, symbol: u64) -> Option<String> {
        let m = &self.layout.method;
        let len = u64::from(self.u16_at(symbol + m.symbol_length)?);
        let bytes = self
            .memory
            .read_vec(symbol + m.symbol_body, len, MAX_SYMBOL)
            .ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The symbol at constant-pool index `index` of `pool`.
    fn pool_symbol(&self, pool: u64, index: u16) -> Option<String> {
        let m = &self.layout.method;
        let entry = pool + m.constant_pool_size + 8 * u64::from(index);
        // The low bit tags the entry; symbols are aligned.
        let symbol = self.memory.read_u64(entry).ok()? & !1;
        if symbol == 0 {
            return None;
        }
        self.symbol(symbol)
    }

    /// The method at `method`.
    pub fn method(&self, method: u64) -> Option<JavaMethod> {
        let m = &self.layout.method;
        let read = |at: u64| self.memory.read_u64(at).ok().filter(|&p| p != 0);
        let const_method = read(method + m.const_method)?;
        let pool = read(const_method + m.constants)?;
        let holder = read(pool + m.pool_holder)?;
        let class = java_class_name(&self.symbol(read(holder + m.klass_name)?)?);
        let name = self.pool_symbol(pool, self.u16_at(const_method + m.name_index)?)?;
        let signature = self
            .pool_symbol(pool, self.u16_at(const_method + m.signature_index)?)
            .unwrap_or_default();
        let source_index = match m.source_file_index {
            SourceFileIndex::InPool(at) => self.u16_at(pool + at),
            SourceFileIndex::InKlass(at) => self.u16_at(holder + at),
        };
        let source_file = source_index
            .filter(|&i| i != 0)
            .and_then(|i| self.pool_symbol(pool, i));
        let lines = self.lines(const_method).unwrap_or_default();
        Some(JavaMethod {
            class,
            name,
            signature,
            source_file,
            lines,
            bytecodes: const_method + m.const_method_size,
            code_size: self.u16_at(const_method + m.code_size).unwrap_or(0),
        })
    }

    /// The line-number table of the `ConstMethod` at `const_method`: right
    /// after its bytecodes.
    fn lines(&self, const_method: u64) -> Option<Vec<(u32, u32)>> {
        let m = &self.layout.method;
        let mut flags = [0u8];
        self.memory
            .read_exact(const_method + m.flags, &mut flags)
            .ok()?;
        if flags[0] & HAS_LINE_NUMBER_TABLE == 0 {
            return None;
        }
        let code_size = u64::from(self.u16_at(const_method + m.code_size)?);
        let table = const_method + m.const_method_size + code_size;
        // The table's length is not stored: read a block, shorter near the
        // end of a mapping, and decode up to its end marker.
        let bytes = [MAX_LINE_TABLE, 256, 32]
            .iter()
            .find_map(|&len| self.memory.read_vec(table, len, MAX_LINE_TABLE).ok())?;
        Some(line_table(&bytes, self.layout.unsigned5_base()))
    }
}

/// A class's name as `Class.getName()` and the JVM's stack traces show it,
/// from its internal name: packages joined by `.`; a hidden class (a
/// lambda's, a lambda form's) keeps its `/0x…` suffix, which the internal
/// name writes with `+` (no Java identifier holds either character).
pub fn java_class_name(internal: &str) -> String {
    internal.replace('/', ".").replace('+', "/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bytecode_pointer_gives_its_index_within_the_method_only() {
        let method = JavaMethod {
            class: "JvmSplit".into(),
            name: "deopt".into(),
            signature: "(J)V".into(),
            source_file: Some("JvmSplit.java".into()),
            lines: vec![(0, 153), (4, 154), (59, 166)],
            bytecodes: 0x1000,
            code_size: 72,
        };
        assert_eq!(method.bci_of(0x1000 + 59), 59);
        assert_eq!(method.line(method.bci_of(0x1000 + 59)), 166);
        // Outside its bytecodes (a stale or torn slot): the method's entry.
        for bcp in [0xfff, 0x1000 + 72, 0, u64::MAX] {
            assert_eq!(method.bci_of(bcp), 0, "{bcp:#x}");
        }
    }

    #[test]
    fn hidden_classes_are_named_as_the_jvm_names_them() {
        assert_eq!(java_class_name("java/util/HashMap"), "java.util.HashMap");
        assert_eq!(
            java_class_name("Lam$$Lambda$84+0x00007f0564007c48"),
            "Lam$$Lambda$84/0x00007f0564007c48"
        );
        assert_eq!(
            java_class_name("java/lang/invoke/LambdaForm$DMH+0x0000000800c01000"),
            "java.lang.invoke.LambdaForm$DMH/0x0000000800c01000"
        );
    }
}
