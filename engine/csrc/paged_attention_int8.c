/* paged_attention.c over int8 K/V pages (kv_dtype int8): the same code, compiled again
   with its page values widened from int8 as they are loaded and scaled per token and KV
   head by the scales each page ends with. */
#define KV_INT8 1
#include "paged_attention.c"
