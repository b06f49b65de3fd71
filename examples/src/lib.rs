//! Examples live in this folder as cargo examples; see `embedded_host.rs`.
