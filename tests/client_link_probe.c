/* client_link_probe.c — a program built from libspecd-client and what it
 * links (net, base, the protocol), every object of those archives included
 * (tests/client.cmake links them whole): if any of them referred to model
 * code, this program would not link. tests/check_client_deps.sh then reads
 * its dynamic dependencies and symbols. */
#include "specd/client.h"

#include <stdio.h>

int main(void) {
    sd_client_params p = sd_client_default_params();
    sd_sampling s = sd_sampling_default();
    printf("%s %d\n", p.coordinator, sd_sampling_validate(&s) == SD_OK);
    return 0;
}
