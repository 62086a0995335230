//! V8 (Node.js): what each binary says about its frames and objects.
//!
//! The unwinder is built in steps: this first one reads a V8 binary's
//! introspection data and resolves the layout the walk and the symbolizer
//! need, for V8 10.2 (Node 18) to 13.6 (Node 24).

pub mod introspection;
pub mod layout;
#[cfg(test)]
mod tests;

pub use introspection::{InspectError, V8Binary, V8Version, inspect};
pub use layout::{MissingConstant, V8Layout, resolve};
