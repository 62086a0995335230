//! Sets and clears the slots of `UNWIND_TABLES` on a thread of its own.
//!
//! Every update or delete of an array of maps waits for an RCU grace period
//! before the syscall returns (the kernel's `maybe_wait_bpf_programs`): 4 to
//! 16 ms each on the machines measured, whatever the table's size. A program
//! mapping 35 libraries new to BPF (`curl`) cost the profiler's loop 280 ms
//! of such waits, during which no other new process could be described and
//! all their samples were dropped. Here the waits happen off that loop, in
//! the order asked (so a slot cleared then set again ends up set), and each
//! finished set is reported back.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use aya::maps::MapData;
use tracing::warn;

/// What the thread is asked to do, in order.
enum SlotOp {
    /// Points `slot` at `inner`, a filled table of `file_id`.
    Set {
        slot: u32,
        file_id: u64,
        inner: MapData,
    },
    /// Empties `slot`.
    Clear { slot: u32 },
}

/// A set that finished.
#[derive(Debug)]
pub struct SlotSet {
    /// The slot.
    pub slot: u32,
    /// The file whose table it now holds (or failed to).
    pub file_id: u64,
    /// The kernel's answer.
    pub result: std::io::Result<()>,
}

/// The thread; stopped (after the work queued) when dropped.
pub struct SlotWriter {
    ops: Option<Sender<SlotOp>>,
    done: Receiver<SlotSet>,
    thread: Option<JoinHandle<()>>,
    /// Sets asked for and not yet taken back by [`Self::finished`].
    pending: usize,
}

impl SlotWriter {
    /// Starts the thread on its own descriptor of the outer map. `notify`
    /// is woken after each finished set.
    pub fn spawn(outer: BorrowedFd<'_>, notify: Arc<tokio::sync::Notify>) -> std::io::Result<Self> {
        let outer = outer.try_clone_to_owned()?;
        let (ops, op_rx) = channel::<SlotOp>();
        let (done_tx, done) = channel();
        let thread = std::thread::Builder::new()
            .name("icecore-slots".into())
            .spawn(move || run(&outer, &op_rx, &done_tx, &notify))?;
        Ok(Self {
            ops: Some(ops),
            done,
            thread: Some(thread),
            pending: 0,
        })
    }

    /// Queues pointing `slot` at `inner`.
    pub fn set(&mut self, slot: u32, file_id: u64, inner: MapData) -> std::io::Result<()> {
        self.send(SlotOp::Set {
            slot,
            file_id,
            inner,
        })?;
        self.pending += 1;
        Ok(())
    }

    /// Queues emptying `slot`.
    pub fn clear(&mut self, slot: u32) -> std::io::Result<()> {
        self.send(SlotOp::Clear { slot })
    }

    fn send(&self, op: SlotOp) -> std::io::Result<()> {
        self.ops
            .as_ref()
            .and_then(|ops| ops.send(op).ok())
            .ok_or_else(|| std::io::Error::other("the slot writer thread is gone"))
    }

    /// The sets finished since the last call.
    pub fn finished(&mut self) -> Vec<SlotSet> {
        let sets: Vec<SlotSet> = self.done.try_iter().collect();
        self.pending = self.pending.saturating_sub(sets.len());
        sets
    }

    /// Sets queued and not yet taken back by [`Self::finished`].
    pub fn pending(&self) -> usize {
        self.pending
    }
}

impl Drop for SlotWriter {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has done what is queued.
        self.ops = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(
    outer: &OwnedFd,
    ops: &Receiver<SlotOp>,
    done: &Sender<SlotSet>,
    notify: &tokio::sync::Notify,
) {
    for op in ops {
        match op {
            SlotOp::Set {
                slot,
                file_id,
                inner,
            } => {
                let result = update_element(outer.as_fd(), slot, inner.fd().as_fd());
                // The outer map holds the kernel's reference now (or the
                // set failed): the descriptor can go.
                drop(inner);
                if done
                    .send(SlotSet {
                        slot,
                        file_id,
                        result,
                    })
                    .is_err()
                {
                    return;
                }
                notify.notify_one();
            }
            SlotOp::Clear { slot } => {
                if let Err(e) = delete_element(outer.as_fd(), slot) {
                    // The slot keeps its old table until set again; no
                    // process's mapping table points at it any more.
                    warn!(slot, "cannot clear an unwind table slot: {e}");
                }
            }
        }
    }
}

/// The prefix of `union bpf_attr` that the element commands read.
#[repr(C)]
struct ElementAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn element_command(command: libc::c_long, attr: &ElementAttr) -> std::io::Result<()> {
    // SAFETY: `attr` is a valid bpf_attr prefix for the element commands;
    // the key and value it points at outlive the call (see the callers).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_ref(attr),
            size_of::<ElementAttr>(),
        )
    };
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `BPF_MAP_UPDATE_ELEM` on an array of maps: `index` takes a reference to
/// the map behind `inner`.
pub fn update_element(
    map: BorrowedFd<'_>,
    index: u32,
    inner: BorrowedFd<'_>,
) -> std::io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    let value = inner.as_raw_fd() as u32;
    let attr = ElementAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: std::ptr::from_ref(&index) as u64,
        value: std::ptr::from_ref(&value) as u64,
        flags: 0, // BPF_ANY
    };
    element_command(BPF_MAP_UPDATE_ELEM, &attr)
}

/// `BPF_MAP_DELETE_ELEM` on an array of maps (aya has no call for it): drops
/// the kernel's reference to the inner map at `index`.
pub fn delete_element(map: BorrowedFd<'_>, index: u32) -> std::io::Result<()> {
    const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
    let attr = ElementAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: std::ptr::from_ref(&index) as u64,
        value: 0,
        flags: 0,
    };
    element_command(BPF_MAP_DELETE_ELEM, &attr)
}
