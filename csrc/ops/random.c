/* Lowerings: random family. */
#include "table.h"

const pj_lowering_entry_t pj_lowerings_random[] = {
    {NULL, NULL},
};
