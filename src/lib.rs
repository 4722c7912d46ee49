pub use hyfi_core::*;
