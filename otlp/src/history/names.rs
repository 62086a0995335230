//! Frame names as the flame graph shows them, interned: one id per (name,
//! frame type), so that trees are built from integers.

use std::{collections::HashMap, mem::size_of, sync::Arc};

use crate::model::{Frame, FrameKind, Stack};

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
    pub built_bytes: usize,
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

    fn intern(&mut self, name: Arc<str>, kind: FrameKind) -> NameId {
        let key = FrameName { name, kind };
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.names.len() as NameId;
        self.built_bytes += 2 * size_of::<FrameName>() + 16;
        self.names.push(key.clone());
        self.ids.insert(key, id);
        id
    }

    /// The stack's names from the root down. A frame with inlined
    /// functions gives one name per function, the outermost first; an
    /// unsymbolized one is named after its file (`[libc.so.6]`), as
    /// flame graph tools do, so that its addresses add up in one place.
    pub fn path_of(&mut self, stack: &Stack) -> Box<[NameId]> {
        let mut path = Vec::with_capacity(stack.len());
        for frame in stack.iter().rev() {
            if frame.lines.is_empty() {
                let name = self.unsymbolized(frame);
                path.push(self.intern(name, frame.kind));
            } else {
                for line in frame.lines.iter().rev() {
                    path.push(self.intern(line.function_name.clone(), frame.kind));
                }
            }
        }
        path.into_boxed_slice()
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
