__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int work(int x) { volatile int a[4]; a[0] = x; return leaf(a[0]) + leaf(x + 1); }
void _start(void) {
  int r = work(2);
  __asm__ volatile("mov %0, %%edi\n\tmov $60, %%eax\n\tsyscall" :: "r"(r) : "rdi", "rax");
  __builtin_unreachable();
}
