import CanopyMessages
import Foundation

// MARK: - Devices and reminders (canopy-remind)

extension APIHandlers {
    func listDevices(_ input: Operations.ListDevices.Input) async throws -> Operations.ListDevices.Output {
        let devices = try await call(Reminders.ListDevices.self, Empty())
        return .ok(.init(body: .json(.init(devices: try devices.map(Components.Schemas.Device.init)))))
    }

    func registerDevice(_ input: Operations.RegisterDevice.Input) async throws -> Operations.RegisterDevice.Output {
        guard case .json(let body) = input.body else { throw CanopyError(.badRequest, "the body is JSON") }
        let device = try await call(
            Reminders.RegisterDevice.self,
            .init(
                channel: try convert(body.channel), address: body.address, name: body.name,
                secret: body.secret, accessToken: body.accessToken))
        return .created(.init(body: .json(try .init(device))))
    }

    func removeDevice(_ input: Operations.RemoveDevice.Input) async throws -> Operations.RemoveDevice.Output {
        _ = try await call(Reminders.RemoveDevice.self, .init(id: try RequestFieldError.identifier(input.path.deviceID, "deviceID")))
        return .noContent(.init())
    }

    func sendTestNotification(_ input: Operations.SendTestNotification.Input) async throws -> Operations.SendTestNotification.Output {
        let reply = try await call(Reminders.SendTest.self, .init(deviceID: try RequestFieldError.identifier(input.path.deviceID, "deviceID")))
        return .ok(.init(body: .json(.init(accepted: reply.accepted, detail: reply.detail))))
    }

    func listPendingReminders(_ input: Operations.ListPendingReminders.Input) async throws -> Operations.ListPendingReminders.Output {
        let reminders = try await call(Reminders.Pending.self, .init(limit: input.query.limit ?? 64))
        return .ok(.init(body: .json(.init(reminders: try reminders.map(Components.Schemas.Reminder.init)))))
    }

    func listReminderFailures(_ input: Operations.ListReminderFailures.Input) async throws -> Operations.ListReminderFailures.Output {
        let failures = try await call(Reminders.Failures.self, .init(limit: input.query.limit ?? 100))
        return .ok(
            .init(
                body: .json(
                    .init(
                        failures: try failures.map { failure in
                            Components.Schemas.Failure(
                                reminder: try .init(failure.reminder), deviceID: failure.deviceID, attempts: failure.attempts,
                                lastError: failure.lastError, at: failure.at)
                        }))))
    }
}

extension Components.Schemas.Device {
    init(_ device: Reminders.Device) throws {
        self.init(
            id: device.id, channel: try convert(device.channel), address: device.address, name: device.name, active: device.active,
            registeredAt: device.registeredAt, deactivatedReason: device.deactivatedReason)
    }
}

extension Components.Schemas.Reminder {
    init(_ reminder: Reminders.Reminder) throws {
        self.init(
            taskID: reminder.taskID, plantID: reminder.plantID, kind: try convert(reminder.kind), title: reminder.title, due: reminder.due,
            state: try convert(reminder.state))
    }
}
