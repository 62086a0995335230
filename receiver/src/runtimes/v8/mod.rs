//! V8 (Node.js): what each binary says about its frames and objects.
//!
//! The unwinder is built in steps. So far: a V8 binary's introspection
//! data and the layout the walk and the symbolizer need, for V8 10.2
//! (Node 18) to 13.6 (Node 24), and a process described to the walk
//! (`icecore_unwinders::v8`), and functions named as `--cpu-prof` names
//! them, checked on live processes of each version.

pub mod introspection;
pub mod layout;
pub mod names;
pub mod positions;
pub mod process;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;

pub use introspection::{InspectError, V8Binary, V8Version, inspect};
pub use layout::{MissingConstant, V8Layout, resolve};
