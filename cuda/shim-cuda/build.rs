//! The shim's link arguments (`tessera-link`): it is libcuda.so.1, and NEEDs the real
//! library at the fixed path where the plugin mounts it in the container
//! (`tessera::prepare::library::CONTAINER_DRIVER_DIR`; `tessera-interpose`'s `loader/resolve.rs`
//! looks the real functions up there). That path is no soname, so a lookup by soname
//! finds the shim first and the real library behind it.

fn main() {
    tessera_link::no_start_files();
    tessera_link::soname("libcuda.so.1");
    tessera_link::needed("/usr/local/tessera/driver/libcuda.real");
}
