/*
 * TEST EQUIPMENT, not product code: DCMI power management for OpenIPMI's ipmi_sim.
 *
 * Stock ipmi_sim answers DCMI (netfn 0x2C, group extension 0xDC) with 0xC1. Loaded with
 * `loadlib "ipmi_sim_dcmi.so" "watts=220"`, this answers Get DCMI Capabilities, Get Power
 * Reading, Get/Set Power Limit and Activate/Deactivate Power Limit as DCMI 1.5 describes,
 * including the completion codes a real BMC gives for a limit out of range (0x84), a bad
 * correction time (0x85), a bad sampling period (0x89) and no active limit (0x80).
 * The console command `dcmi_set_power WATTS` changes the reading at run time.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <OpenIPMI/serv.h>
#include <OpenIPMI/mcserv.h>

#define DCMI_GROUP 0xDC

static uint16_t reading_w = 200;
static uint16_t limit_w = 0;
static uint8_t limit_set = 0, limit_active = 0, exception_action = 0;
static uint32_t correction_ms = 0;
static uint16_t sampling_s = 0;

static void put16(unsigned char *p, uint32_t v) { p[0] = v & 0xff; p[1] = (v >> 8) & 0xff; }
static void put32(unsigned char *p, uint32_t v) { put16(p, v); put16(p + 2, v >> 16); }
static uint32_t get16(const unsigned char *p) { return p[0] | (p[1] << 8); }
static uint32_t get32(const unsigned char *p) { return get16(p) | (get16(p + 2) << 16); }

static void
handle_dcmi(lmc_data_t *mc, msg_t *msg, unsigned char *rdata, unsigned int *rdata_len, void *cb_data)
{
    const unsigned char *d = msg->data;

    rdata[1] = DCMI_GROUP;
    *rdata_len = 2;
    switch (msg->cmd) {
    case 0x01: /* Get DCMI Capabilities Info */
        rdata[0] = 0;
        rdata[2] = 1; rdata[3] = 5; rdata[4] = 2;   /* DCMI 1.5, parameter revision 2 */
        rdata[5] = 0; rdata[6] = 0x01; rdata[7] = 0; rdata[8] = 0;  /* power management supported */
        *rdata_len = 9;
        return;
    case 0x02: /* Get Power Reading */
        if (msg->len < 4) { rdata[0] = 0xC7; return; }
        rdata[0] = 0;
        put16(rdata + 2, reading_w);
        put16(rdata + 4, reading_w > 20 ? reading_w - 20 : 0);
        put16(rdata + 6, reading_w + 30);
        put16(rdata + 8, reading_w);
        put32(rdata + 10, (uint32_t) time(NULL));
        put32(rdata + 14, 1000);
        rdata[18] = 0x40;  /* power measurement active */
        *rdata_len = 19;
        return;
    case 0x03: /* Get Power Limit */
        if (msg->len < 3) { rdata[0] = 0xC7; return; }
        rdata[0] = limit_active ? 0 : 0x80;  /* 0x80: no active set power limit */
        rdata[2] = 0; rdata[3] = 0;
        rdata[4] = exception_action;
        put16(rdata + 5, limit_w);
        put32(rdata + 7, correction_ms);
        rdata[11] = 0; rdata[12] = 0;
        put16(rdata + 13, sampling_s);
        *rdata_len = 15;
        return;
    case 0x04: /* Set Power Limit */
        if (msg->len < 15) { rdata[0] = 0xC7; return; }
        if (get16(d + 5) < 50 || get16(d + 5) > 2000) { rdata[0] = 0x84; return; }
        if (get32(d + 7) < 1000 || get32(d + 7) > 600000) { rdata[0] = 0x85; return; }
        if (get16(d + 13) == 0) { rdata[0] = 0x89; return; }
        exception_action = d[4];
        limit_w = get16(d + 5);
        correction_ms = get32(d + 7);
        sampling_s = get16(d + 13);
        limit_set = 1;
        rdata[0] = 0;
        return;
    case 0x05: /* Activate/Deactivate Power Limit */
        if (msg->len < 4) { rdata[0] = 0xC7; return; }
        if ((d[1] & 1) && !limit_set) { rdata[0] = 0x80; return; }
        limit_active = d[1] & 1;
        rdata[0] = 0;
        return;
    default:
        rdata[0] = 0xC1;  /* invalid command */
        return;
    }
}

static int
cmd_set_power(emu_out_t *out, emu_data_t *emu, lmc_data_t *mc, char **toks)
{
    char *tok = strtok_r(NULL, " \t\n", toks);

    if (!tok)
        return -1;
    reading_w = (uint16_t) strtoul(tok, NULL, 0);
    return 0;
}

int
ipmi_sim_module_init(sys_data_t *sys, const char *initstr)
{
    const char *w = initstr ? strstr(initstr, "watts=") : NULL;

    if (w)
        reading_w = (uint16_t) strtoul(w + 6, NULL, 0);
    ipmi_emu_register_group_extension_handler(DCMI_GROUP, handle_dcmi, NULL);
    ipmi_emu_add_cmd("dcmi_set_power", NOMC, cmd_set_power);
    return 0;
}
