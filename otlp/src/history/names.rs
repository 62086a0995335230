//! Frame names as the flame graph shows them, interned: one id per (name,
//! frame type), so that trees are built from integers.

use std::{collections::HashMap, sync::Arc};

use crate::model::{Frame, FrameKind};

/// An interned (name, frame type).
pub(super) type NameId = u32;

/// A frame's name and type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct FrameName {
    pub name: Arc<str>,
    pub kind: FrameKind,
}

/// The names of every stack in the history.
#[derive(Debug, Default)]
pub(super) struct NameTable {
    names: Vec<FrameName>,
    ids: HashMap<FrameName, NameId>,
    /// Names built here (not shared with the model): `[libc.so.6]`.
    built_bytes: usize,
}

impl NameTable {
    /// The name with this id.
    pub fn get(&self, id: NameId) -> &FrameName {
        &self.names[id as usize]
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Heap bytes: the names built here, and the containers at their
    /// current capacities.
    pub fn heap_bytes(&self) -> usize {
        self.built_bytes
            + super::vec_bytes::<FrameName>(self.names.capacity())
            + super::map_bytes::<FrameName, NameId>(self.ids.capacity())
    }

    fn intern(&mut self, name: Arc<str>, kind: FrameKind) -> NameId {
        let key = FrameName { name, kind };
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.names.len() as NameId;
        self.names.push(key.clone());
        self.ids.insert(key, id);
        id
    }

    /// A frame's names, the outermost first: one per function with its
    /// inlined ones; an unsymbolized frame is named after its file
    /// (`[libc.so.6]`), as flame graph tools do, so that its addresses add
    /// up in one place.
    pub fn names_of(&mut self, frame: &Frame) -> Box<[NameId]> {
        if frame.lines.is_empty() {
            let name = self.unsymbolized(frame);
            return Box::new([self.intern(name, frame.kind)]);
        }
        frame
            .lines
            .iter()
            .rev()
            .map(|line| self.intern(line.function_name.clone(), frame.kind))
            .collect()
    }

    fn unsymbolized(&mut self, frame: &Frame) -> Arc<str> {
        let file = frame.mapping.as_ref().map(|m| &m.filename);
        let base = file
            .and_then(|f| f.rsplit('/').next())
            .filter(|b| !b.is_empty());
        let name = match (base, frame.kind) {
            (Some(base), _) => format!("[{base}]"),
            (None, FrameKind::Kernel) => "[kernel]".to_owned(),
            (None, _) => "[unknown]".to_owned(),
        };
        if let Some(id) = self.ids.get(&FrameName {
            name: Arc::from(name.as_str()),
            kind: frame.kind,
        }) {
            return self.names[*id as usize].name.clone();
        }
        self.built_bytes += name.len() + 32;
        Arc::from(name)
    }
}
