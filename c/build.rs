//! Names the shared library as it is installed (`scripts/install-c`): programs linked
//! with `-lrdmactor` then record `librdmactor.so.0`, the name the install links to
//! the file, not the build's `librdmactor_c.so`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmactor.so.0");
}
