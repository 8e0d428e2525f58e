{
  "variables": {
    "hardening": ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-fstack-protector-strong", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"]
  },
  "targets": [
    {
      "target_name": "sbx_native",
      "sources": ["src/addon.c", "src/sys.c", "src/watch.c", "src/statdir.c", "src/fileio.c"],
      "cflags": ["<@(hardening)"]
    },
    {
      "target_name": "sbx-exec-shim",
      "type": "executable",
      "sources": ["src/exec-shim.c"],
      "cflags": ["<@(hardening)"]
    }
  ]
}
