{
  "targets": [
    {
      "target_name": "sbx_native",
      "sources": ["src/addon.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-O2"]
    },
    {
      "target_name": "sbx-exec-shim",
      "type": "executable",
      "sources": ["src/exec-shim.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-O2"]
    }
  ]
}
