; Inno Setup script: an installer for the one-folder build in build\dist\Arbor.
; NOT run on this project's machine (Linux); used by installer\windows\build_windows.ps1.
#define Version GetEnv("ARBOR_VERSION")
[Setup]
AppId={{6C1B9E2A-7F3D-4E0B-9A55-3D2F8C1A7B40}
AppName=Arbor
AppVersion={#Version}
AppPublisher=Arbor developers
DefaultDirName={autopf}\Arbor
DefaultGroupName=Arbor
OutputDir=..\..\build
OutputBaseFilename=Arbor-{#Version}-windows-x64-setup
Compression=lzma2
SolidCompression=yes
ArchitecturesInstallIn64BitMode=x64compatible
SetupIconFile=..\..\build\icons\arbor.ico
UninstallDisplayIcon={app}\arbor.exe
PrivilegesRequiredOverridesAllowed=dialog

[Files]
Source: "..\..\build\dist\Arbor\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Icons]
Name: "{group}\Arbor"; Filename: "{app}\arbor.exe"
Name: "{autodesktop}\Arbor"; Filename: "{app}\arbor.exe"; Tasks: desktopicon

[Tasks]
Name: desktopicon; Description: "Create a desktop shortcut"; Flags: unchecked

[Run]
Filename: "{app}\arbor.exe"; Description: "Start Arbor"; Flags: nowait postinstall skipifsilent
