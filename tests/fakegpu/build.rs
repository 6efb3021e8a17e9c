//! Bind the library's references to its own symbols at link time (`-Bsymbolic`), so nothing
//! inside the fake ever goes through an interposed export; and never unload it (`-z nodelete`):
//! its executor threads and exit handler outlive any `dlclose`.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
