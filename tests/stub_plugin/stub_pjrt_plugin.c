/* A stand-in PJRT plugin for tests/test_plugin_errors.py: it exports GetPjrtApi with a chosen C
 * API version (STUB_MAJOR / STUB_MINOR) and the error functions, initializes, and refuses to
 * create a client. Built by the test with the same pjrt_c_api.h the runtime is built with.
 * -DSTUB_NULL_API makes GetPjrtApi return NULL. */
#include <string.h>

#include "pjrt_c_api.h"

#ifndef STUB_MAJOR
#define STUB_MAJOR PJRT_API_MAJOR
#endif
#ifndef STUB_MINOR
#define STUB_MINOR PJRT_API_MINOR
#endif

/* The header defines PJRT_Error (a vtable the runtime does not use); the stub's error extends it
 * with its message. */
typedef struct {
  PJRT_Error base;
  const char *message;
} stub_error_t;

static stub_error_t refused = {{NULL}, "stub plugin: no device here (client creation refused)"};
static PJRT_Api api;

static void error_destroy(PJRT_Error_Destroy_Args *a) { (void)a; }

static void error_message(PJRT_Error_Message_Args *a) {
  const stub_error_t *e = (const stub_error_t *)a->error;
  a->message = e->message;
  a->message_size = strlen(e->message);
}

static PJRT_Error *error_get_code(PJRT_Error_GetCode_Args *a) {
  a->code = PJRT_Error_Code_UNAVAILABLE;
  return NULL;
}

static PJRT_Error *plugin_initialize(PJRT_Plugin_Initialize_Args *a) {
  (void)a;
  return NULL;
}

static PJRT_Error *client_create(PJRT_Client_Create_Args *a) {
  (void)a;
  return &refused.base;
}

const PJRT_Api *GetPjrtApi(void) {
#ifdef STUB_NULL_API
  return NULL;
#else
  memset(&api, 0, sizeof api);
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = STUB_MAJOR;
  api.pjrt_api_version.minor_version = STUB_MINOR;
  api.PJRT_Error_Destroy = error_destroy;
  api.PJRT_Error_Message = error_message;
  api.PJRT_Error_GetCode = error_get_code;
  api.PJRT_Plugin_Initialize = plugin_initialize;
  api.PJRT_Client_Create = client_create;
  return &api;
#endif
}
