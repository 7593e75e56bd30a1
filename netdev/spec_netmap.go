package netdev

import (
	"fmt"
	"strconv"
	"tapgro/netmapio"
)

// parseNetmap reads netmap's keys. The name itself is checked by netmapio.ParseName, the
// decoder netdev.Open uses, so a name that parses here is one the port can register.
func (sp *Spec) parseNetmap(kv map[string]string) error {
	sp.Role = RoleAttach
	name, err := netmapio.ParseName(kv["ifname"])
	if err != nil {
		return err
	}
	sp.IfName = kv["ifname"]
	if v, ok := kv["vnet-hdr"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 0 && n != 10 && n != 12) {
			return fmt.Errorf("netdev: bad value %q for key \"vnet-hdr\" (want 0, 10 or 12)", v)
		}
		if n != 0 && !name.VALE() {
			return fmt.Errorf("netdev: vnet-hdr=%d needs a VALE port (valeX:Y); %q carries plain frames", n, sp.IfName)
		}
		sp.HdrLen = n
	}
	return nil
}
