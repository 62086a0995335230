//! Method entries and classes: what turns `leaf` into `Object#leaf`,
//! `baz` into `Foo.baz` and a C function's frame into `Integer#times`, the
//! way Ruby 3.4's own backtraces name them.

use super::{
    layouts::{ClassNames, flags},
    objects::Objects,
};

/// `rb_callable_method_entry_t.def`.
const ME_DEF: u64 = 16;
/// `rb_callable_method_entry_t.owner`.
const ME_OWNER: u64 = 32;
/// `rb_method_definition_t.original_id`, after the bitfields (8 bytes) and
/// the body union (24 bytes), in 3.1 to 3.4.
const DEF_ORIGINAL_ID: u64 = 32;
/// `st_table`: entry count, first and past-the-last entry, entries.
const ST_ENTRIES_START: u64 = 32;
const ST_ENTRIES_BOUND: u64 = 40;
const ST_ENTRIES: u64 = 48;
/// `st_table_entry`: hash, key, record.
const ST_ENTRY_BYTES: u64 = 24;
/// Instance variables of a class searched for its name, at most.
const MAX_CLASS_IVARS: u64 = 64;
/// Longest class name kept.
const MAX_CLASS_NAME: usize = 512;

/// How a method is called on its owner: `Foo#bar` (instances) or `Foo.bar`
/// (the singleton's object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qualifier {
    /// `Foo::Bar`.
    pub class: String,
    /// `#` or `.`.
    pub separator: char,
}

impl Qualifier {
    /// `method` qualified: `Foo#bar`.
    pub fn name(&self, method: &str) -> String {
        format!("{}{}{method}", self.class, self.separator)
    }
}

/// A method entry read: its name and how to qualify it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodEntry {
    /// `def->original_id`'s name.
    pub name: Option<String>,
    /// Its owner's name, when it has one.
    pub qualifier: Option<Qualifier>,
}

impl MethodEntry {
    /// `Foo#bar`, or what is known of it.
    pub fn full_name(&self) -> Option<String> {
        let name = self.name.as_deref()?;
        Some(match &self.qualifier {
            Some(q) => q.name(name),
            None => name.to_owned(),
        })
    }
}

impl Objects<'_> {
    /// The method entry at `value` (the `ep[-2]` of a method's or C
    /// function's frame); `None` when it is not one (a cref, for example).
    pub fn method_entry(&self, value: u64) -> Option<MethodEntry> {
        let basic = self.flags_of(value)?;
        let is_method_entry = basic & flags::TYPE_MASK == flags::T_IMEMO
            && (basic >> flags::IMEMO_KIND_SHIFT) & 0xf == flags::IMEMO_METHOD_ENTRY;
        if !is_method_entry {
            return None;
        }
        let def = self.word(value + ME_DEF)?;
        let name = self
            .word(def + DEF_ORIGINAL_ID)
            .and_then(|id| self.id_name(id));
        let qualifier = self
            .word(value + ME_OWNER)
            .and_then(|owner| self.qualifier(owner));
        Some(MethodEntry { name, qualifier })
    }

    /// How methods owned by `owner` are named.
    pub fn qualifier(&self, owner: u64) -> Option<Qualifier> {
        let flags = self.flags_of(owner)?;
        if !matches!(flags & flags::TYPE_MASK, flags::T_CLASS | flags::T_MODULE) {
            return None;
        }
        if flags & self.layout.singleton_flag != 0 && flags & flags::TYPE_MASK == flags::T_CLASS {
            let object = self.attached_object(owner)?;
            return Some(Qualifier {
                class: self.class_name(object)?,
                separator: '.',
            });
        }
        Some(Qualifier {
            class: self.class_name(owner)?,
            separator: '#',
        })
    }

    /// The name of the class or module `class` (`Foo::Bar`); `None` for an
    /// anonymous one.
    pub fn class_name(&self, class: u64) -> Option<String> {
        let flags = self.flags_of(class)?;
        if !matches!(flags & flags::TYPE_MASK, flags::T_CLASS | flags::T_MODULE) {
            return None;
        }
        let path = match self.layout.class_names {
            ClassNames::Fields { classpath, .. } => self.word(class + classpath)?,
            ClassNames::IvarTable { .. } => self.class_ivar(class, "__classpath__")?,
            ClassNames::Unknown => return None,
        };
        self.string(path).filter(|name| {
            // An anonymous class's temporary path is `#<Class:0x…>`.
            !name.is_empty() && !name.starts_with('#') && name.len() <= MAX_CLASS_NAME
        })
    }

    /// The object a singleton class is the singleton of.
    fn attached_object(&self, singleton: u64) -> Option<u64> {
        match self.layout.class_names {
            ClassNames::Fields {
                attached_object, ..
            } => self.word(singleton + attached_object),
            ClassNames::IvarTable { .. } => self.class_ivar(singleton, "__attached__"),
            ClassNames::Unknown => None,
        }
    }

    /// The instance variable `name` of a 3.1 class, from its `iv_tbl`.
    fn class_ivar(&self, class: u64, name: &str) -> Option<u64> {
        let ClassNames::IvarTable { ext, iv_tbl } = self.layout.class_names else {
            return None;
        };
        let ext = self.word(class + ext)?;
        let table = self.word(ext.checked_add(iv_tbl)?)?;
        if table == 0 {
            return None;
        }
        let start = self.word(table + ST_ENTRIES_START)?;
        let bound = self.word(table + ST_ENTRIES_BOUND)?;
        let entries = self.word(table + ST_ENTRIES)?;
        if bound < start || bound - start > MAX_CLASS_IVARS {
            return None;
        }
        (start..bound).find_map(|i| {
            let entry = entries.checked_add(i * ST_ENTRY_BYTES)?;
            let key = self.word(entry + 8)?;
            (self.id_name(key)? == name).then_some(())?;
            self.word(entry + 16)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_qualified_as_ruby_3_4_prints_them() {
        let instance = MethodEntry {
            name: Some("times".into()),
            qualifier: Some(Qualifier {
                class: "Integer".into(),
                separator: '#',
            }),
        };
        assert_eq!(instance.full_name().as_deref(), Some("Integer#times"));
        let singleton = MethodEntry {
            name: Some("baz".into()),
            qualifier: Some(Qualifier {
                class: "Foo::Bar".into(),
                separator: '.',
            }),
        };
        assert_eq!(singleton.full_name().as_deref(), Some("Foo::Bar.baz"));
        let anonymous = MethodEntry {
            name: Some("call".into()),
            qualifier: None,
        };
        assert_eq!(anonymous.full_name().as_deref(), Some("call"));
        assert_eq!(
            MethodEntry {
                name: None,
                qualifier: None
            }
            .full_name(),
            None
        );
    }
}
