/* Lowerings: conv family. */
#include "table.h"

const pj_lowering_entry_t pj_lowerings_conv[] = {
    {NULL, NULL},
};
