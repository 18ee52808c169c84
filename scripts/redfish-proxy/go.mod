module restatus.test/redfish-proxy

go 1.24
