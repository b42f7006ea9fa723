/* LD_PRELOAD helper for machines without gdb (the GPU device machine): on SIGSEGV/SIGBUS it
 * names the library and nearest exported symbol of the faulting instruction and of the code
 * addresses found in the top 256 stack words, then exits with status 99. Run Python without
 * faulthandler (pytest: -p no:faulthandler): it would catch the signal first and re-raise it,
 * and this handler would then see raise()'s frame instead of the fault's.
 *   cc -shared -fPIC -O1 -o /tmp/segv_where.so scripts/segv_where.c -ldl
 *   LD_PRELOAD=/tmp/segv_where.so python ...
 * Only async-signal-tolerable calls a crashed process can still make: dladdr and fprintf to an
 * unbuffered stderr (good enough for a post-mortem; the process ends right after). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <ucontext.h>
#include <unistd.h>

static void segv_where_name(const char *what, void *pc) {
  Dl_info info;
  if (dladdr(pc, &info) && info.dli_fname) {
    void *base = info.dli_saddr ? info.dli_saddr : info.dli_fbase;
    fprintf(stderr, "%s %p in %s (%s+%#lx)\n", what, pc, info.dli_fname,
            info.dli_sname ? info.dli_sname : "?", (unsigned long)((char *)pc - (char *)base));
  } else {
    fprintf(stderr, "%s %p (no library)\n", what, pc);
  }
}

static void segv_where_handler(int sig, siginfo_t *si, void *ctx) {
  ucontext_t *uc = ctx;
  fprintf(stderr, "signal %d at address %p\n", sig, si->si_addr);
  segv_where_name("pc", (void *)uc->uc_mcontext.gregs[REG_RIP]);
  void **sp = (void **)uc->uc_mcontext.gregs[REG_RSP];
  for (int k = 0; k < 256; k++) {
    Dl_info info;
    if (dladdr(sp[k], &info) && info.dli_sname) segv_where_name("stack", sp[k]);
  }
  _exit(99);
}

__attribute__((constructor)) static void segv_where_install(void) {
  struct sigaction sa = {0};
  sa.sa_sigaction = segv_where_handler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
