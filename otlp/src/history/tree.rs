//! The call tree a query sums stacks into, and the pruned tree it sends.

use std::sync::Arc;

use super::names::{NameId, NameTable};
use super::view::{FlameNode, TopRow};

/// A node: one path from the root.
#[derive(Debug, Clone, Copy)]
struct TrieNode {
    name: NameId,
    parent: u32,
    depth: u32,
    total: u64,
    self_value: u64,
    base_total: u64,
    base_self: u64,
}

/// Stacks summed by path; node 0 is the root. Paths come sorted, so a
/// path shares its first nodes with the one before it: no lookups.
#[derive(Debug)]
pub(super) struct Trie {
    nodes: Vec<TrieNode>,
    /// The nodes of the last path added, root excluded.
    open: Vec<u32>,
    self_by_name: Vec<u64>,
    total_by_name: Vec<u64>,
    /// The last stack each name was counted in, so that a recursive
    /// function's total counts each stack once.
    counted_in: Vec<u32>,
    stacks_added: u32,
}

impl Trie {
    /// An empty tree over `names` names.
    pub fn new(names: usize) -> Self {
        Self {
            nodes: vec![TrieNode {
                name: NameId::MAX,
                parent: 0,
                depth: 0,
                total: 0,
                self_value: 0,
                base_total: 0,
                base_self: 0,
            }],
            open: Vec::new(),
            self_by_name: vec![0; names],
            total_by_name: vec![0; names],
            counted_in: vec![u32::MAX; names],
            stacks_added: 0,
        }
    }

    /// Nodes in the whole tree, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Adds a root-first `path` with `value` in the shown range and `base`
    /// in the baseline; paths must come in sorted order.
    pub fn add_sorted(&mut self, path: &[NameId], value: u64, base: u64) {
        let shared = self
            .open
            .iter()
            .zip(path)
            .take_while(|(node, name)| self.nodes[**node as usize].name == **name)
            .count();
        self.open.truncate(shared);
        for &name in &path[shared..] {
            let parent = self.open.last().copied().unwrap_or(0);
            let depth = self.nodes[parent as usize].depth + 1;
            self.open.push(self.nodes.len() as u32);
            self.nodes.push(TrieNode {
                name,
                parent,
                depth,
                total: 0,
                self_value: 0,
                base_total: 0,
                base_self: 0,
            });
        }
        self.bump(0, value, base, path.is_empty());
        for i in 0..self.open.len() {
            self.bump(self.open[i], value, base, i + 1 == path.len());
        }
        if value == 0 {
            return;
        }
        let stamp = self.stacks_added;
        self.stacks_added = self.stacks_added.wrapping_add(1);
        if let Some(&leaf) = path.last() {
            self.self_by_name[leaf as usize] += value;
        }
        for &name in path {
            if self.counted_in[name as usize] != stamp {
                self.counted_in[name as usize] = stamp;
                self.total_by_name[name as usize] += value;
            }
        }
    }

    fn bump(&mut self, node: u32, value: u64, base: u64, leaf: bool) {
        let n = &mut self.nodes[node as usize];
        n.total += value;
        n.base_total += base;
        if leaf {
            n.self_value += value;
            n.base_self += base;
        }
    }

    /// The tree to send: from the root, or from its only child when the
    /// view is focused on it; nodes narrower than `min_share` of that root
    /// left out, and at most `max_nodes` kept, the widest first. In a diff
    /// a node's width is the mean of its shares of the two ranges.
    /// Returns the tree and its number of nodes.
    pub fn to_tree(
        &self,
        names: &NameTable,
        focused: bool,
        min_share: f64,
        max_nodes: usize,
    ) -> (FlameNode, usize) {
        // Focused: every path starts with the focused frame, node 1.
        let root = if focused && self.nodes.len() > 1 {
            1
        } else {
            0
        };
        let (all, base_all) = (self.nodes[0].total, self.nodes[0].base_total);
        let width = |n: &TrieNode| -> f64 {
            let shown = if all > 0 {
                n.total as f64 / all as f64
            } else {
                0.0
            };
            if base_all > 0 {
                (shown + n.base_total as f64 / base_all as f64) / 2.0
            } else {
                shown
            }
        };
        let root_depth = self.nodes[root as usize].depth;
        let threshold = width(&self.nodes[root as usize]) * min_share.max(0.0);
        // Candidates: under the root (by depth and ancestry), wide enough.
        let mut under = vec![false; self.nodes.len()];
        under[root as usize] = true;
        let mut candidates: Vec<u32> = vec![root];
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            if node.depth > root_depth && under[node.parent as usize] && width(node) >= threshold {
                under[i] = true;
                candidates.push(i as u32);
            }
        }
        if candidates.len() > max_nodes.max(1) {
            // Widest first, parents before children on ties: what is kept
            // stays one tree.
            candidates.sort_by(|&a, &b| {
                let (a, b) = (&self.nodes[a as usize], &self.nodes[b as usize]);
                width(b)
                    .total_cmp(&width(a))
                    .then_with(|| a.depth.cmp(&b.depth))
            });
            candidates.truncate(max_nodes.max(1));
        }
        let mut kept_children: Vec<Vec<u32>> = vec![Vec::new(); self.nodes.len()];
        let mut all_children = vec![0usize; self.nodes.len()];
        for node in self.nodes.iter().skip(1) {
            all_children[node.parent as usize] += 1;
        }
        let mut kept = vec![false; self.nodes.len()];
        for &c in &candidates {
            kept[c as usize] = true;
        }
        for &c in &candidates {
            if c != root && kept[self.nodes[c as usize].parent as usize] {
                kept_children[self.nodes[c as usize].parent as usize].push(c);
            }
        }
        let count = candidates.len();
        let tree = self.build(root, names, &kept_children, &all_children);
        (tree, count)
    }

    fn build(
        &self,
        node: u32,
        names: &NameTable,
        kept_children: &[Vec<u32>],
        all_children: &[usize],
    ) -> FlameNode {
        let n = &self.nodes[node as usize];
        let (name, kind) = if node == 0 {
            (Arc::from("all"), None)
        } else {
            let frame = names.get(n.name);
            (frame.name.clone(), Some(frame.kind))
        };
        let mut children: Vec<FlameNode> = kept_children[node as usize]
            .iter()
            .map(|&c| self.build(c, names, kept_children, all_children))
            .collect();
        children.sort_by(|a, b| a.name.cmp(&b.name));
        FlameNode {
            name,
            kind,
            total: n.total,
            self_value: n.self_value,
            base_total: n.base_total,
            base_self: n.base_self,
            hidden_children: all_children[node as usize] - children.len(),
            children,
        }
    }

    /// Functions by total value, then by self value, each list at most
    /// `limit` long, without repeats.
    pub fn top(&self, names: &NameTable, limit: usize) -> Vec<TopRow> {
        let mut by_total: Vec<usize> = (0..self.total_by_name.len())
            .filter(|&i| self.total_by_name[i] > 0)
            .collect();
        let mut by_self = by_total.clone();
        by_total.sort_by(|&a, &b| self.total_by_name[b].cmp(&self.total_by_name[a]));
        by_self.sort_by(|&a, &b| self.self_by_name[b].cmp(&self.self_by_name[a]));
        let mut seen = vec![false; self.total_by_name.len()];
        by_total
            .into_iter()
            .take(limit)
            .chain(by_self.into_iter().take(limit))
            .filter(|&i| !std::mem::replace(&mut seen[i], true))
            .map(|i| {
                let frame = names.get(i as NameId);
                TopRow {
                    name: frame.name.clone(),
                    kind: frame.kind,
                    self_value: self.self_by_name[i],
                    total: self.total_by_name[i],
                }
            })
            .collect()
    }
}
