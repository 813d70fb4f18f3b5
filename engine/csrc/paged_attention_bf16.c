/* paged_attention.c over bf16 K/V pages (kv_dtype bf16): the same code, compiled again
   with its page values widened from bf16 as they are loaded. */
#define KV_BF16 1
#include "paged_attention.c"
