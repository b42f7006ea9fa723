// The PyTorch headers (nearly) every bridge file includes, compiled once per torch release into
// a precompiled header (Makefile: $(CXX_OBJ_DIR)/torch_headers_pch.h.gch) and force-included
// ahead of each bridge file. ATen.h alone takes most of a bridge file's compile time (about 14 s
// of it on the development machine; about 5 s a file with the precompiled header). Only
// headers that every file may see go here: no macros of ours, nothing that depends on a file.
#include <ATen/ATen.h>
#include <torch/library.h>
