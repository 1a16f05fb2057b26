pub use switchyard_compiler as compiler;
